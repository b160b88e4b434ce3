"""`specdec bench --engine vllm|llama.cpp` / `--server URL`: the engine bench's command body and its
pages (table, JSON, Markdown, plot). commands/bench.py hands over here; the work is in serving/."""

from __future__ import annotations

import json
import os
from contextlib import ExitStack
from pathlib import Path

import typer
from rich.table import Table

from . import own_files
from ..atomic import check_writable, write_atomically
from ..errors import UserError
from ..prompts import read_file
from ..runtime import threads as thread_policy
from .common import WRITE_FAILED, error_line, invocation, plain_console, resolve_pair, write_output

ENGINES = ("vllm", "llama.cpp")  # the engines specdec starts (serving/configs.py builds their servers)
DEFAULT_LOOP = "plain,auto"  # specdec's own loop beside an engine bench: plain decoding and the default drafter
DIED = 3  # a server died mid-run: the levels finished are written, exit 3


def check_engine(engine: str | None, server: str | None, reference: str | None) -> None:
    """The engine options' combinations, and the engine's installation, before any model is touched."""
    if engine is not None and engine not in ENGINES:
        raise UserError(f"--engine {engine!r}: the engines specdec can start are {', '.join(ENGINES)}")
    if engine and server:
        raise UserError("--engine starts servers and --server attaches to one: give one of them")
    if reference and not server:
        raise UserError("--reference is the plain server --server is compared with: give --server too")
    if engine == "vllm":
        from ..serving.environment import vllm_python

        vllm_python()
    elif engine == "llama.cpp":
        from ..serving.environment import llama_server

        llama_server()


def engine_bench(*, engine, server, reference, prompts: Path, modes, concurrency, rate, repeats, max_new_tokens,
                 slo, json_out, markdown, plot, models, pair, target, draft, threads, port, requests,
                 loop: str | None = DEFAULT_LOOP) -> None:
    check_engine(engine, server, reference)
    from ..measure.loop_bench import parse_modes as loop_modes
    from ..serving import load_bench
    loop = None if loop in (None, "", "none") else loop
    if loop:
        loop_modes(loop)
    if rate and concurrency:
        raise UserError("--concurrency is a closed loop and --rate an open one: give one of them")
    levels_text = rate or concurrency or "1,4"
    levels = load_bench.parse_levels(levels_text, "--rate" if rate else "--concurrency")
    slos = load_bench.parse_slos(slo)
    default = f"{load_bench.plain_mode(engine)},{load_bench.mode_prefix(engine)}ngram:4" if engine else ""
    chosen = load_bench.parse_modes(modes or default, engine) if engine else []  # plain and lookup at K 4
    for path, option, ours in ((markdown, "--markdown", own_files.markdown_page), (plot, "--plot", own_files.image)):
        if path:
            check_writable(path, option, ours=ours)
    items = read_file(prompts)
    spec = resolve_pair(models, pair, target, draft)
    if engine and port:  # a busy port said before torch, the tokenizer and the model load (each start checks again)
        from ..serving.server import check_port, mode_port

        for index, mode in enumerate(chosen):
            check_port(mode_port(port, index), mode.name)
    thread_policy.apply(threads)  # before torch: the own loop's threads, the servers' count (serving/environment.py)
    from ..pairs.loading import transformers_directory  # torch and transformers: after every cheap check
    from ..serving import configs as serving_configs
    from ..serving.server import attach

    model_dir = transformers_directory(spec.target.source)  # its tokenizer: the same ids for every engine
    encoded = [load_bench.Request(str(pid), ids)
               for pid, ids in serving_configs.encode_prompts(model_dir, [(str(p.id), p.text) for p in items])]
    progress = serving_configs.progress_line
    manifest = {**invocation("bench"),
                "pair": spec.name, "prompts": len(items), "max_new_tokens": max_new_tokens, "repeats": repeats,
                "loop": "open (Poisson arrivals, requests/s)" if rate else "closed (requests in flight)", "slo_ms": slos}
    with ExitStack() as stack:
        if engine:
            configs = serving_configs.server_configs(spec, chosen, threads, port,
                                                     eagle3_directory=lambda: served_eagle3(spec, engine, progress),
                                                     parallel=4 if rate else max(levels), progress=progress)
            servers = serving_configs.start_all(stack, configs, progress)
            targets = {name: serving_configs.as_target(s) for name, s in servers.items()}
            manifest["engine"] = engine_entry(servers)
        else:
            targets = {}
            if reference:
                plain = attach(reference, "--reference")
                targets[load_bench.plain_mode(plain.dialect)] = load_bench.Target(plain)
            targets["server"] = load_bench.Target(attach(server))
            manifest["engine"] = {"attached": {name: t.endpoint.url for name, t in targets.items()}}
        try:
            result = load_bench.run(targets, encoded, levels, max_tokens=max_new_tokens, repeats=repeats,
                                    rate=bool(rate), slos=slos, count=requests, progress=progress)
            failure = None
        except load_bench.BenchInterrupted as exc:
            result, failure = exc.report, str(exc)
    result["manifest"] = manifest | {"target": _target_entry(spec, model_dir, threads, engine), "machine": _machine()}
    if engine and loop and not failure:  # after the servers stopped: nothing else runs while it is timed
        result["own_loop"] = own_loop(spec, items, encoded, requests, max_new_tokens, loop, progress)
    if failure:
        result["interrupted"] = failure
    _emit(result, json_out, markdown, plot)
    if failure:
        error_line(f"{failure}; the levels finished before it are written")
        raise typer.Exit(DIED)


def served_eagle3(spec, engine: str, progress) -> Path:
    """The pair's head exported (once, into the cache) for ``engine``'s EAGLE-3 layer."""
    from ..export.served_head import eagle3_directory
    from ..pairs.registry import HEAD

    return eagle3_directory(spec.alternate(HEAD).head, progress, engine)


def own_loop(spec, items, encoded, count, max_new_tokens, modes_text, progress) -> dict:
    """specdec's own loop on the prompts of a concurrency-1 level (one request at a time),
    greedy, for reference beside the engine: the pair's dtype, not the servers' float32, and it stops
    at the end of an answer where the servers' requests ignore it (tok/s compare, lengths may not).
    Its threads were set with the servers' (``engine_bench``)."""
    from ..measure import loop_bench
    from ..pairs.profile import open_profile
    from ..serving.load import requests_for_level
    from .common import sampling_params, warning_line

    chosen = loop_bench.parse_modes(modes_text)
    wanted = dict.fromkeys(r.prompt_id for r in requests_for_level(encoded, 1, count))
    prompts = [p for p in items if str(p.id) in wanted]
    watcher = open_profile(None, spec, warn=warning_line) if any(m.kind in loop_bench.AUTO_KINDS for m in chosen) else None
    progress(f"specdec's own loop ({', '.join(map(str, chosen))}, {spec.target.dtype}) on {len(prompts)} prompts, one at a time")
    runtime, report = loop_bench.bench_pair(spec, chosen, prompts, max_new_tokens, sampling_params(0.0, 0, 1.0),
                                            watcher=watcher)
    keep = ("tokens_per_s", "speedup_vs_plain", "acceptance_rate", "mean_accepted_length", "completion_length",
            "identical_to_plain", "wall_s", "ttft_s", "p50_token_latency_s", "p90_token_latency_s")
    return {"concurrency": 1, "dtype": spec.target.dtype, "computed_by": runtime.target.computed_by(),
            "prompts": len(prompts), "modes": {
        mode: {k: figures.get(k) for k in keep} for mode, figures in report["modes"].items()}}


def engine_entry(servers) -> dict:
    from ..serving import environment

    first = next(iter(servers.values())).config
    if first.engine == "llama.cpp":
        binary = environment.llama_server()
        entry = {"name": environment.llama_version(binary), "binary": str(binary)}
    else:
        entry = {"name": environment.engine_version(), "environment": str(environment.vllm_env())}
    return entry | {"servers": {name: {"arguments": s.config.arguments(s.endpoint.port), "start_s": round(s.started_s, 2),
                                       "log": str(s.log_path)} for name, s in servers.items()}}


def _target_entry(spec, model_dir: Path, threads: int | None, engine: str | None) -> dict:
    """The target's source, the directory or GGUF the servers read, and its weight files' sha256."""
    from types import SimpleNamespace

    from ..pairs import manifest
    from ..serving.environment import server_environment

    if engine == "llama.cpp":
        from ..pairs.loading import gguf_file

        gguf = gguf_file(spec.target.source, "llama.cpp serves GGUF")
        return {"source": str(spec.target.source), "gguf": str(gguf), "files": {gguf.name: manifest.sha256(gguf)},
                "server_threads": threads or os.cpu_count() or 1}
    return {"source": str(spec.target.source), "directory": str(model_dir),
            "files": manifest.file_hashes(SimpleNamespace(files=model_dir)),
            "server_threads": int(server_environment(threads)["OMP_NUM_THREADS"])}


def _machine() -> dict:
    from ..pairs import manifest

    return manifest.machine() | {"libraries": manifest.libraries()}


def _emit(result: dict, json_out: bool, markdown: Path | None, plot: Path | None) -> None:
    if json_out:
        print(json.dumps(result, indent=2))
    else:
        out = plain_console()
        out.print(table(result))
        for line in summary_lines(result):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
    if markdown and not write_output("--markdown", markdown, lambda: write_atomically(markdown, markdown_page(result))):
        raise typer.Exit(WRITE_FAILED)
    if plot and not write_output("--plot", plot, lambda: plot_curve(result, plot)):
        raise typer.Exit(WRITE_FAILED)


COLUMNS = [("req/s", "request_throughput"), ("out tok/s", "output_tok_s"), ("TTFT p50", ("ttft", "p50_ms")),
           ("TTFT p99", ("ttft", "p99_ms")), ("TPOT p50", ("tpot", "p50_ms")), ("ITL p50", ("itl", "p50_ms")),
           ("ITL p99", ("itl", "p99_ms")), ("E2E p50", ("e2el", "p50_ms")), ("E2E p90", ("e2el", "p90_ms")),
           ("E2E p99", ("e2el", "p99_ms")), ("failed", "failed"), ("accept", ("acceptance", "acceptance_rate")),
           ("acc len", ("acceptance", "mean_acceptance_length"))]


def _value(figures: dict, key):
    value = figures.get(key[0], {}).get(key[1]) if isinstance(key, tuple) else figures.get(key)
    if value is None:
        return "–"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _gain_cell(result: dict, mode: str, level: str) -> str:
    g = result["gain"].get(mode, {}).get(level)
    if not g or g["gain"] is None:
        return "–"
    return f"{g['gain']:.2f}×" + (f" [{g['low']:.2f}, {g['high']:.2f}]" if g["low"] is not None else "")


def rows(result: dict):
    """(level, mode, gain cell, cells...) in level order: the modes of one level side by side."""
    for level in result["levels"]:
        for mode, by_level in result["modes"].items():
            if str(level) in by_level:
                yield [str(level), mode, _gain_cell(result, mode, str(level))] + [_value(by_level[str(level)], k) for _, k in COLUMNS]


def table(result: dict) -> Table:
    loop = result["manifest"].get("loop", "")
    grid = Table(title=f"engine bench, {loop}; latencies in ms; gain = output tok/s over {result['plain']} (95 % interval)",
                 title_justify="left")
    for header in ["level", "mode", "gain"] + [h for h, _ in COLUMNS]:
        grid.add_column(header, justify="left" if header == "mode" else "right")
    for row in rows(result):
        grid.add_row(*row)
    return grid


def summary_lines(result: dict) -> list[str]:
    lines = []
    for mode, point in result["crossover"].items():
        lines.append(f"{mode}: " + (f"the gain falls below 1 at concurrency {point:g}" if point is not None
                                    else "the gain stays at or above 1 at every level measured"))
    for family, k_rows in result["k_table"].items():
        lines.append(f"{family}: num_speculative_tokens_per_batch_size {json.dumps(k_rows)}")
    own = result.get("own_loop")
    if own:
        engine_plain = result["modes"].get(result["plain"], {}).get("1", {}).get("output_tok_s")
        shown = ", ".join(f"{mode} {f['tokens_per_s']:.1f} tok/s" + (f" ({f['speedup_vs_plain']:.2f}× its plain)" if mode != "plain" else "")
                          for mode, f in own["modes"].items())
        versus = f"; {result['plain']} at concurrency 1: {engine_plain:.1f} tok/s" if engine_plain else ""
        lines.append(f"specdec's own loop at concurrency 1 ({own['dtype']}, {own['prompts']} prompts, stops at the answer's "
                     f"end): {shown}{versus}")
    return lines


def markdown_page(result: dict) -> str:
    headers = ["level", "mode", "gain"] + [h for h, _ in COLUMNS]
    lines = [own_files.ENGINE_BENCH_TITLE, "", f"Made with `{result['manifest']['command']}` on {result['manifest']['date']}.", ""]
    if result.get("interrupted"):
        lines += [f"**Interrupted:** {result['interrupted']}; the levels below finished before it.", ""]
    lines += ["| " + " | ".join(headers) + " |", "|---" * len(headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows(result)]
    lines += ["", *[f"- {line}" for line in summary_lines(result)], "", "## Manifest", "", "```json",
              json.dumps(result["manifest"], indent=2), "```", ""]
    return "\n".join(lines)


def plot_curve(result: dict, path: Path) -> None:
    """Gain and p50 end-to-end latency against the level, one line per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..measure.plot import save_figure

    figure, (gain_axes, latency_axes) = plt.subplots(1, 2, figsize=(11, 4.2))
    for mode, by_level in result["modes"].items():
        levels = [int(lv) for lv in by_level]
        latency_axes.plot(levels, [by_level[str(lv)]["e2el"]["p50_ms"] for lv in levels], "o-", label=mode)
        if mode in result["gain"]:
            gains = result["gain"][mode]
            gain_axes.plot([int(lv) for lv in gains], [g["gain"] for g in gains.values()], "o-", label=mode)
    gain_axes.axhline(1.0, color="grey", linewidth=0.8)
    gain_axes.set(xscale="log", xlabel="level", ylabel=f"output tok/s over {result['plain']}", title="speculative gain")
    latency_axes.set(xscale="log", xlabel="level", ylabel="ms", title="end-to-end latency p50")
    for axes in (gain_axes, latency_axes):
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
    figure.tight_layout()
    save_figure(figure, path)
