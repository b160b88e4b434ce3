"""`specdec bench`: this loop and transformers' generate, side by side on the same prompts."""

# torch and transformers are imported inside the command bodies, so that --help and bad options answer without them.
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.progress import Progress
from rich.table import Table

from ..runtime import threads as thread_policy
from . import interrupt
from . import own_files
from ..atomic import check_writable, write_atomically
from ..pairs.profile import open_profile
from ..pairs.free_kinds import FREE_KINDS
from ..pairs.registry import HEAD, MODEL, STORE, PairSpec
from ..measure.mode_kinds import modes_help
from ..prompts import read_file
from .bench_batch import BATCH_HELP, batch_output, batch_sizes, check_modes
from .engine_bench import engine_bench
from .common import (
    ConcurrencyOption,
    WRITE_FAILED,
    AcceptOption,
    DraftOption,
    DtypeOption,
    MaxNewTokensOption,
    ModelsOption,
    PairOption,
    ProfileOption,
    PromptsOption,
    TargetOption,
    ThreadsOption,
    accept_rule,
    check_count,
    check_seed,
    check_threads,
    check_sampling_options,
    invocation,
    lossy_message,
    plain_console,
    refuse_given,
    resolve_pair,
    sampling_params,
    stderr_console,
    user_errors,
    warning_line,
    write_output,
)

if TYPE_CHECKING:
    from ..decoding.loaded_pair import LoadedPair

COLUMNS = [
    ("tok/s", "tokens_per_s"), ("× plain", "speedup_vs_plain"), ("× hf-plain", "speedup_vs_hf_plain"),
    ("predicted", "predicted_speedup"), ("accept", "acceptance_rate"), ("α", "alpha"), ("tok/round", "mean_accepted_length"),
    ("rounds", "rounds"), ("length", "completion_length"), ("TTFT s", "ttft_s"), ("p50 ms", "p50_token_latency_s"),
    ("p90 ms", "p90_token_latency_s"), ("p99 ms", "p99_token_latency_s"), ("= plain", "identical_to_plain"),
    ("mean K", "mean_k"), ("drafted", "mean_drafted"), ("nodes", "mean_nodes"),
]
# Parameters one branch of the command reads and the other does not: given to the other, refused.
LOOP_ONLY = ("temperature", "seed", "dtype", "profile", "samples", "accept", "batch")
ENGINE_ONLY = ("concurrency", "rate", "repeats", "slo", "plot", "port", "requests", "loop_modes")
ONLY_WHEN_MEASURED = {"mean_k", "mean_drafted", "mean_nodes"}  # auto's alone: a column of dashes for every other mode says nothing
# Every mode, from the one list of them (measure/mode_kinds.py; the free drafters' from their table).
MODES_HELP = (f"Comma-separated: {modes_help()}. MODE@RULE runs a speculative mode under a LOSSY acceptance rule "
              "(head:3@top:3, spec:3@lenient:2, head:3@typical:0.3,0.09) beside the same mode lossless, and reports "
              "what the rule cost. Default: plain, hf-plain, ngram:4, hf-lookup:4, plus spec:4 and hf-assisted:4 when "
              "the pair has a draft model, head:4 when it has a draft head (as its default drafter or under `drafters:`).")


@user_errors
def bench_command(
    prompts: PromptsOption,
    modes: Annotated[Optional[str], typer.Option("--modes", metavar="MODE,MODE,...", help=MODES_HELP)] = None,
    pair: PairOption = None,
    max_new_tokens: MaxNewTokensOption = 64,
    temperature: Annotated[float, typer.Option("--temperature", metavar="T", help="0: greedy (the default, so outputs can be compared token by token).")] = 0.0,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Seed for sampling modes: this loop's modes sample one text from it (lossy rules excepted).")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="The whole result as one JSON object on stdout.")] = False,
    markdown: Annotated[Optional[Path], typer.Option("--markdown", metavar="FILE", help="Also write the table, the command and the manifest as a Markdown page (missing directories are created).")] = None,
    target: TargetOption = None,
    draft: DraftOption = None,
    dtype: DtypeOption = None,
    models: ModelsOption = None,
    profile: ProfileOption = None,
    threads: ThreadsOption = None,
    samples: Annotated[int, typer.Option("--samples", metavar="S", help="Runs per prompt and mode, with seeds seed, seed+1, … shared by all modes (paired).")] = 1,
    accept: AcceptOption = "exact",
    batch: Annotated[Optional[str], typer.Option("--batch", metavar="N,N,...", help=BATCH_HELP)] = None,
    engine: Annotated[Optional[str], typer.Option("--engine", metavar="ENGINE", help="Benchmark a serving engine instead of this loop, one server per --modes entry, stopped at the end (docs/engines.md). 'vllm' from vLLM's own environment (`bash install.sh vllm`): vllm-plain, vllm-ngram:K, vllm-draft:K, vllm-eagle3:K with the pair's head exported once, vllm-config:FILE with a --speculative-config JSON such as `specdec export --out` writes; default vllm-plain,vllm-ngram:4. 'llama.cpp' serves the pair's GGUF itself with the server `bash install.sh llama.cpp` builds: llama-plain, llama-ngram:K (ngram-mod, the type that drafted best here), llama-ngram-simple:K, llama-ngram-map-k:K, llama-ngram-mod:K, llama-ngram-cache:K, llama-draft:K (the pair's draft model converted to GGUF once), llama-eagle3:K (the pair's head exported for llama.cpp's EAGLE-3 layer and converted once); default llama-plain,llama-ngram:4.")] = None,
    server: Annotated[Optional[str], typer.Option("--server", metavar="URL", help="Benchmark an OpenAI-compatible server already running at URL (API key from $SPECDEC_API_KEY, never printed).")] = None,
    reference: Annotated[Optional[str], typer.Option("--reference", metavar="URL", help="With --server: the plain server it is compared with (the gain's denominator).")] = None,
    concurrency: ConcurrencyOption = None,
    rate: Annotated[Optional[str], typer.Option("--rate", metavar="R,R,...", help="Engine bench, open loop: Poisson arrivals at R requests/s, one level each (instead of --concurrency).")] = None,
    repeats: Annotated[int, typer.Option("--repeats", metavar="N", help="Engine bench: runs of every level, interleaved across modes; 2 or more give the gain a 95 % interval.")] = 1,
    slo: Annotated[Optional[str], typer.Option("--slo", metavar="ttft:MS,tpot:MS", help="Engine bench: count goodput, the requests per second that meet every limit (ttft, tpot, e2el in ms).")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", metavar="FILE.png", help="Engine bench: draw the gain and the latency against the level.")] = None,
    port: Annotated[Optional[int], typer.Option("--port", metavar="P", help="Engine bench: the first managed server's port (the next ones count up; default: free ports).")] = None,
    requests: Annotated[Optional[int], typer.Option("--requests", metavar="N", help="Engine bench: requests per level, the prompts cycled or cut (default: every prompt, and at least 2 per request in flight).")] = None,
    loop_modes: Annotated[str, typer.Option("--loop-modes", metavar="MODE,MODE,...", help="Engine bench with --engine: specdec's own loop on the concurrency-1 prompts after the servers stop, for reference ('none' to skip).")] = "plain,auto",
) -> None:
    """Measure speed, acceptance and latency per mode against plain decoding of the same target.

    Modes run interleaved prompt by prompt after a warm-up; each mode's tokens are checked against
    plain decoding's, and this loop's fixed-K speculative modes show the speed-up predicted from the
    measured acceptance, draft cost and verify cost next to the measured one. Mode auto reads the
    calibration profile (--profile) to start from; without one it starts from the pair's K.

    With --batch 1,2,4,8,16 it measures this loop's batches instead: every prompt as one job per batch
    size and mode, the gain over plain at each size, the K table by batch size and the break-even size.

    With --engine vllm|llama.cpp (or --server URL) it benchmarks a serving engine under concurrency
    instead: per mode and level request throughput, output tok/s, TTFT, TPOT, ITL and end-to-end
    latency (p50/p90/p99, as `vllm bench serve` defines them), failures, acceptance from the
    server's counters, the gain over the engine's plain mode, where it falls below 1, and the
    per-batch-size K table.

    Exit codes: 0 done; 2 bad input (or a server that did not start); 3 the result was printed but
    --markdown could not be written, or a server died mid-run (the levels finished are written).
    """
    check_count("--max-new-tokens", max_new_tokens, 1)
    check_threads(threads)
    if engine or server or reference:  # a serving engine under load: commands/engine_bench.py
        refuse_given(("batch",), "measures this loop's batches; a serving engine's bench takes --concurrency N,N,...")
        refuse_given(LOOP_ONLY, "applies to this loop's bench, not to a serving engine's (--engine, --server)")
        if not engine:
            refuse_given(("port", "loop_modes"), "applies to the servers --engine starts, not to one at --server")
        check_count("--repeats", repeats, 1)
        check_count("--requests", requests, 1)
        return engine_bench(engine=engine, server=server, reference=reference, prompts=prompts, modes=modes,
                            concurrency=concurrency, rate=rate, repeats=repeats, max_new_tokens=max_new_tokens, slo=slo,
                            json_out=json_out, markdown=markdown, plot=plot, models=models, pair=pair, target=target,
                            draft=draft, threads=threads, port=port, requests=requests, loop=loop_modes)
    refuse_given(ENGINE_ONLY, "applies to a serving engine's bench: give --engine or --server")
    check_sampling_options(temperature, 0, 1.0)
    check_count("--samples", samples, 1)
    check_seed(seed, samples, f"--samples {samples}")
    sizes = batch_sizes(batch, samples, accept)
    rule = accept_rule(accept)
    if markdown:
        check_writable(markdown, "--markdown", ours=own_files.markdown_page)
    items = read_file(prompts)
    spec = resolve_pair(models, pair, target, draft, dtype=dtype)

    thread_policy.apply(threads)  # before torch loads
    from ..measure import lossy, loop_bench
    from ..pairs import manifest

    sampling = sampling_params(temperature, 0, 1.0)
    chosen = loop_bench.with_rule(loop_bench.parse_modes(modes or _default_modes(spec, bool(sizes))), rule)
    if sizes:
        from ..measure import batch_bench

        check_modes(chosen)
    console = stderr_console()
    lossy_modes = [m for m in chosen if not m.rule.lossless]
    if lossy_modes and rule.lossless:  # --accept already said so
        names = ", ".join(str(m) for m in lossy_modes)
        warning_line(lossy_message(f"mode{'s' if len(lossy_modes) > 1 else ''} {names} {'are' if len(lossy_modes) > 1 else 'is'}"))
    watcher = None
    if any(m.kind in loop_bench.AUTO_KINDS for m in chosen):
        watcher = open_profile(profile, spec, warn=warning_line)
        console.print(f"specdec: {watcher.seeded()}", soft_wrap=True)
    interrupt.now("benchmarking", "nothing was written: the tables and --markdown come at the end")
    with Progress(console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("benchmarking", total=len(items) * len(chosen) * (len(sizes) if sizes else samples))
        if sizes:  # every prompt as one job per size and mode: measure/batch_bench.py
            runtime, result = batch_bench.bench_pair(spec, chosen, items, max_new_tokens, sampling, seed, watcher, sizes,
                                                     lambda: progress.advance(task))
        else:
            runtime, result = loop_bench.bench_pair(spec, chosen, items, max_new_tokens, sampling, seed, watcher,
                                                    samples, lambda: progress.advance(task))
    result["manifest"] = {
        **invocation("bench"),
        "pair": spec.name,
        "dtype": spec.target.dtype,
        "target": manifest.model_entry(runtime.target),
        "computed_by": runtime.target.computed_by(),
        "draft": _drafter_entry(runtime, spec.drafter.kind),
        "drafters": {kind: _drafter_entry(runtime, kind) for kind in dict.fromkeys(m.drafter_kind for m in chosen) if kind},
        "libraries": manifest.libraries(),
        "machine": manifest.machine(),
        "threads": thread_policy.policy(threads),
        "seed": seed, "temperature": temperature, "max_new_tokens": max_new_tokens, "prompts": len(items),
        "samples": samples, "lossless": not lossy_modes,
    }
    if watcher:  # what seeded auto: a profile file, or (None) the pair's K
        result["manifest"]["profile"] = str(watcher.path) if watcher.profile else None
    if sizes:
        result["manifest"]["batch_sizes"] = sizes
        return batch_output(result, json_out, markdown, f"{spec.name}: {len(items)} prompts, {max_new_tokens} new tokens",
                            sampling.greedy, markdown_page)
    slowed = {mode: f["fallback_forwards"] for mode, f in result["modes"].items() if f.get("fallback_forwards")}
    if slowed:  # a slowdown the speeds alone do not explain
        warning_line("target forwards ran transformers' forward instead of the lean int8/int4 one (slower): "
                     + ", ".join(f"{mode} {count}" for mode, count in slowed.items()) + "; fallback_forwards counts them")
    if json_out:
        print(json.dumps(result, indent=2))
    else:
        out = plain_console()
        out.print(table(result["modes"], f"{spec.name}: {len(items)} prompts, {max_new_tokens} new tokens"))
        for scenario, by_mode in result["scenarios"].items():
            if len(result["scenarios"]) > 1:
                out.print(table(by_mode, f"scenario {scenario}"))
        if result["lossy"]:
            out.print(lossy_table(result["lossy"]))
            for mode, figures in result["lossy"].items():
                out.print(lossy.headline(mode, figures), markup=False, highlight=False, soft_wrap=True)
    differing = [mode for mode, f in result["modes"].items() if not f["identical_to_plain"] and f["lossless"]]
    if differing and sampling.greedy:
        console.print(f"[yellow]modes whose tokens differ from plain decoding: {', '.join(differing)}[/]")
    if markdown and not write_output("--markdown", markdown, lambda: write_atomically(markdown, markdown_page(result))):
        raise typer.Exit(WRITE_FAILED)


def _default_modes(pair: PairSpec, batch: bool = False) -> str:
    """Plain and n-gram modes always; the model and head modes for each such drafter the pair has.
    ``batch`` (--batch): this loop's alone, and auto, whose controller turns drafting down as a batch fills."""
    extra = {MODEL: ",spec:4,hf-assisted:4", HEAD: ",head:4"}
    modes = "plain,hf-plain,ngram:4,hf-lookup:4" + "".join(extra[kind] for kind in extra if pair.alternate(kind))
    return ",".join([m for m in modes.split(",") if not m.startswith("hf-")] + ["auto"]) if batch else modes


def _drafter_entry(runtime: LoadedPair, kind: str):
    """What the manifest records of a drafter: a model's files, a head's weights, or the kind of one
    without weights ('ngram', 'recycle', 'suffix'), and a store's file with its hash."""
    from ..pairs import manifest

    if kind == STORE:
        answers = runtime.pair.alternate(STORE).answers
        return {"store": str(answers), "files": {answers.name: manifest.sha256(answers)}}
    if kind in FREE_KINDS:
        return kind
    if kind == HEAD:
        return manifest.head_entry(runtime.pair.alternate(HEAD).head)
    return manifest.model_entry(runtime.drafter_of(MODEL)[1])


def _cell(key: str, value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if key.endswith("latency_s"):
        return f"{value * 1000:.1f}"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def _columns(by_mode: dict) -> list[tuple[str, str]]:
    return [(h, k) for h, k in COLUMNS if k not in ONLY_WHEN_MEASURED or any(k in f for f in by_mode.values())]


def table(by_mode: dict, title: str) -> Table:
    grid = Table(title=title, title_justify="left")
    grid.add_column("mode")
    columns = _columns(by_mode)
    for header, _ in columns:
        grid.add_column(header, justify="right")
    for mode, figures in by_mode.items():
        grid.add_row(mode, *(_cell(key, figures.get(key)) for _, key in columns))
    return grid


def lossy_table(report: dict) -> Table:
    from ..measure import lossy

    grid = Table(title="lossy rules against the same mode lossless (95 % paired bootstrap intervals)", title_justify="left")
    grid.add_column("mode")
    for header, _ in lossy.COLUMNS:
        grid.add_column(header, justify="right")
    for mode, figures in report.items():
        grid.add_row(mode, *(lossy.cell(figures.get(key)) for _, key in lossy.COLUMNS))
    return grid


def markdown_page(result: dict) -> str:
    from ..measure import batch_figures, lossy

    meta = result["manifest"]
    lines = [own_files.BENCH_TITLE, "", f"Made with `{meta['command']}` on {meta['date']}.", ""]
    scopes = [("all prompts", result["modes"])] + [(f"scenario `{s}`", m) for s, m in result["scenarios"].items()] \
        if "modes" in result else []  # --batch: its own section alone
    for scope, by_mode in scopes:
        columns = _columns(by_mode)
        lines += [f"## {scope}", "", "| mode | " + " | ".join(h for h, _ in columns) + " |",
                  "|---" * (len(columns) + 1) + "|"]
        lines += [f"| {mode} | " + " | ".join(_cell(k, f.get(k)) for _, k in columns) + " |" for mode, f in by_mode.items()]
        lines.append("")
    lines += batch_figures.markdown_section(result["batch"]) if "batch" in result else []
    lines += lossy.markdown_section(result.get("lossy", {}))
    lines += ["## Manifest", "", "```json", json.dumps(meta, indent=2), "```", ""]
    return "\n".join(lines)
