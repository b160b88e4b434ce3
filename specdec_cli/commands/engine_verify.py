"""`specdec verify-equivalence --engine vllm --spec ngram:4` (or `--server URL --reference URL`):
a speculative server's greedy token ids against a plain server's, at concurrency 1 and at a higher
one (batch shape changes the numerics), every divergence located and classified by the plain
server's top-2 logprob margin; the check fails when the speculative server drafted nothing."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import typer
from rich import box
from rich.table import Table
from rich.text import Text

from . import own_files
from ..atomic import check_writable, write_atomically
from ..errors import UserError
from ..limits import MAX_K, NEAR_TIE_TOLERANCE
from ..prompts import read_file
from ..runtime import threads as thread_policy
from .common import WRITE_FAILED, error_line, invocation, plain_console, resolve_pair, write_output
from .engine_bench import check_engine, engine_entry, served_eagle3

TOP_LOGPROBS = 2  # the reference's top-2 at every position: the margin that classifies a divergence
# A margin within what batch shape moves: vLLM's servers run float32 (--dtype float32); llama.cpp's
# batch rows run other kernels than one-token rows (a 5-row block's logits differ by up to 1.2 here).
ENGINE_TOLERANCE = {"vllm": NEAR_TIE_TOLERANCE["float32"], "llama.cpp": 0.5}
SPEC_KINDS = {"vllm": "ngram:K, draft:K or eagle3:K", "llama.cpp": "ngram:K (or ngram-simple:K, ngram-map-k:K, "
              "ngram-mod:K, ngram-cache:K), draft:K or eagle3:K"}


def engine_verify(*, engine, server, reference, spec_text, prompts: Path, concurrency: str | None, max_new_tokens: int,
                  tolerance, strict: bool, raw: bool, json_out: bool, report, models, pair, target, draft, threads) -> None:
    check_engine(engine, server, reference)
    if server and not reference:
        raise UserError("--server is checked against a plain server: give --reference URL too")
    kinds = SPEC_KINDS.get(engine, SPEC_KINDS["vllm"])
    if engine and not spec_text:
        raise UserError(f"--engine {engine} needs --spec {kinds}: the speculative server to check")
    from ..serving.load_bench import mode_prefix, parse_levels, parse_modes, plain_mode

    try:
        modes = parse_modes(f"{plain_mode(engine)},{mode_prefix(engine)}{spec_text}", engine) if engine else []
        if engine and len(modes) < 2:
            raise UserError("plain")
    except UserError:
        raise UserError(f"--spec {spec_text!r}: expected {kinds} (K from 1 to {MAX_K})") from None
    concurrencies = sorted({1, *parse_levels(concurrency or "1,4")})  # 1 always: the batch shape the others are held to
    if report:
        check_writable(report, "--report", ours=own_files.verify_report)
    tolerance = tolerance or ENGINE_TOLERANCE.get(engine, NEAR_TIE_TOLERANCE["float32"])
    items = read_file(prompts)
    spec = resolve_pair(models, pair, target, draft)
    thread_policy.apply(threads)  # before torch: the servers' thread count reads it (serving/environment.py)
    from ..pairs.loading import transformers_directory  # torch and transformers: after every cheap check
    from ..serving import configs as serving_configs
    from ..serving import metrics
    from ..serving.client import ServerDown
    from ..serving.divergence import compare, generate_all
    from ..serving.server import attach

    model_dir = transformers_directory(spec.target.source)
    encoded = serving_configs.encode_prompts(model_dir, [(str(p.id), p.text) for p in items], raw)
    manifest = invocation("verify-equivalence")
    with ExitStack() as stack:
        if engine:
            progress = serving_configs.progress_line
            configs = serving_configs.server_configs(spec, modes, threads,
                                                     eagle3_directory=lambda: served_eagle3(spec, engine, progress),
                                                     parallel=max(concurrencies), progress=progress)
            servers = serving_configs.start_all(stack, configs, progress)
            plain_end, spec_end = servers[modes[0].name].endpoint, servers[modes[1].name].endpoint
            label = modes[1].name
            manifest["engine"] = engine_entry(servers)
        else:
            plain_end, spec_end = attach(reference, "--reference"), attach(server)
            label = spec_end.url  # the URL without its password
            manifest["engine"] = {"attached": {plain_mode(plain_end.dialect): plain_end.url, "server": spec_end.url}}
        levels = {}
        try:
            for level in concurrencies:
                serving_configs.progress_line(f"checking {len(encoded)} prompts at concurrency {level}")
                before = metrics.scrape(spec_end)
                plain = generate_all(plain_end, encoded, max_new_tokens, level, logprobs=TOP_LOGPROBS)
                speculative = generate_all(spec_end, encoded, max_new_tokens, level)
                window = metrics.scrape(spec_end).minus(before)
                again = generate_all(plain_end, encoded, max_new_tokens, level, logprobs=TOP_LOGPROBS)
                levels[str(level)] = with_plain_repeat(compare(encoded, plain, speculative, tolerance),
                                                       compare(encoded, plain, again, tolerance)) | {
                    "drafts": int(window.value(metrics.DRAFTS)), "draft_tokens": int(window.value(metrics.DRAFT_TOKENS)),
                    "accepted": int(window.value(metrics.ACCEPTED))}
        except ServerDown as exc:
            raise UserError(f"a server stopped answering mid-check: {exc}") from None
    equivalent, verdict = decide(levels, strict)
    result = {"pair": spec.name, "speculative": label, "reference": modes[0].name if engine else "reference",
              "prompts": len(encoded), "max_new_tokens": max_new_tokens,
              "tolerance": tolerance, "strict": strict, "levels": levels, "equivalent": equivalent, "verdict": verdict,
              "manifest": manifest}
    if json_out:
        print(json.dumps(result), flush=True)
    else:
        render(result)
    text = json.dumps(result, indent=2) + "\n"
    if report and not write_output("--report", report, lambda: write_atomically(report, text)):
        raise typer.Exit(WRITE_FAILED)
    if not equivalent and not json_out:
        error_line(verdict)
    raise typer.Exit(0 if equivalent else 1)


def with_plain_repeat(speculative: dict, repeat: dict) -> dict:
    """The speculative comparison, each divergence marked where plain itself, asked again, did not
    give the same ids (the cause is then not speculation alone), and the repeat's own counts."""
    unsteady = {d["prompt_id"] for d in repeat["details"]}
    for divergence in speculative["details"]:
        divergence["plain_repeat_differs"] = divergence["prompt_id"] in unsteady
    return speculative | {"plain_repeat": {key: repeat[key] for key in ("identical", "near_ties", "divergences", "failed")}}


def decide(levels: dict, strict: bool) -> tuple[bool, str]:
    drafts = sum(level["drafts"] for level in levels.values())
    failed = sorted({pid for level in levels.values() for pid in level["failed"]})
    real = sum(level["divergences"] for level in levels.values())
    ties = sum(level["near_ties"] for level in levels.values())
    if drafts == 0:
        return False, "the speculative server drafted nothing: its output proves nothing about speculation"
    if failed:
        return False, f"requests failed for {len(failed)} prompt(s) ({', '.join(failed[:5])}): nothing was compared for them"
    if real or (strict and ties):
        return False, f"not equivalent: {real} real divergence(s), {ties} near-tie(s)"
    note = f" ({ties} near-tie(s) within round-off)" if ties else ""
    return True, f"equivalent: speculative token ids equal plain at every level{note}, {drafts} drafts"


def render(result: dict) -> None:
    console = plain_console()
    table = Table(title=f"{result['speculative']} against {result['reference']}, {result['prompts']} prompts, greedy token ids",
                  title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("concurrency", "identical", "near-ties", "divergences", "failed", "drafts", "accepted/drafted",
                   "plain again"):
        table.add_column(column, justify="right")
    for level, r in result["levels"].items():
        table.add_row(level, f"{r['identical']}/{r['prompts']}", str(r["near_ties"]), str(r["divergences"]),
                      str(len(r["failed"])), str(r["drafts"]), f"{r['accepted']}/{r['draft_tokens']}",
                      f"{r['plain_repeat']['identical']}/{r['prompts']} identical")
    console.print(table)
    for level, r in result["levels"].items():
        for d in r["details"]:
            console.print(Text(f"concurrency {level}, prompt {d['prompt_id']}, generated token {d['position']}: "
                               f"{d['speculative_token']} instead of {d['reference_token']} (plain's top-2 margin "
                               f"{'n/a' if d['margin'] is None else format(d['margin'], '.3g')}): {d['kind']}"
                               + ("; plain asked again differs there too" if d["plain_repeat_differs"] else "")))
    console.print(Text(result["verdict"], style="bold green" if result["equivalent"] else "bold red"), soft_wrap=True)
