"""`specdec verify-equivalence`: show, prompt by prompt and K by K, that speculation changed nothing.

Exit code 0 when equivalent, 1 when a divergence that round-off cannot explain (a `mismatch`), or
with --strict any divergence, or plain sampling failed its test against transformers', or always under a lossy --accept
rule (it runs and shows what it changed); 2 for bad input.
"""

# torch and transformers are imported inside the command bodies, so that --help and bad options answer without them.
from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ..runtime import threads as thread_policy
from . import interrupt
from . import own_files
from ..atomic import check_writable, write_atomically
from ..errors import UserError
from ..limits import MAX_BATCH, MAX_K, NEAR_TIE_TOLERANCE, SAMPLING_PROMPTS, SAMPLING_TOKENS
from ..prompts import check_fit, read_file
from .engine_verify import engine_verify
from .common import (
    ConcurrencyOption,
    WRITE_FAILED,
    AcceptOption,
    DrafterOption,
    DraftOption,
    DtypeOption,
    MaxNewTokensOption,
    ModelsOption,
    PairOption,
    PromptsOption,
    RawOption,
    TargetOption,
    LEAST_TEMPERATURE,
    ThreadsOption,
    accept_rule,
    check_batch,
    check_count,
    check_number,
    check_seed,
    check_threads,
    check_tree_drafter,
    parse_k_list,
    plain_console,
    refuse_given,
    resolve_pair,
    stderr_console,
    user_errors,
    write_output,
)

if TYPE_CHECKING:
    from ..measure.equivalence import GreedyResult
    from ..measure.sampling_check import SamplingResult

TOLERANCE_HELP = ", ".join(f"{dtype} {t:g}" for dtype, t in NEAR_TIE_TOLERANCE.items())


@user_errors
def verify_equivalence(
    prompts: PromptsOption,
    pair: PairOption = None,
    k: Annotated[str, typer.Option("--k", "-k", metavar="K,K,...", help=f"Comma-separated K values to check, each 0 to {MAX_K}.")] = "1,4,8",
    tree: Annotated[Optional[str], typer.Option("--tree", metavar="N,N,...", help=f"Check trees of these node budgets (1 to {MAX_K}; the pair's draft head drafting trees, as `generate --tree N`) instead of chains of K.")] = None,
    max_new_tokens: MaxNewTokensOption = 128,
    tolerance: Annotated[Optional[float], typer.Option("--tolerance", metavar="MARGIN", help=f"Largest logit margin a near-tie may have. Default by the target's dtype: {TOLERANCE_HELP}.")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Fail on any divergence, near-ties included.")] = False,
    draws: Annotated[int, typer.Option("--sampling", metavar="N", help=f"Also sample N seeds ({SAMPLING_TOKENS} tokens each) for the first {SAMPLING_PROMPTS} prompts: speculative runs must equal plain sampling under each seed token for token (under an --accept rule other than exact, whose seed fixes no text plain sampling shares, their distribution is tested instead), and plain sampling is tested against transformers' sampler (0: skip).")] = 0,
    temperature: Annotated[float, typer.Option("--temperature", metavar="T", help="Temperature for --sampling.")] = 1.0,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="First seed for --sampling.")] = 0,
    raw: RawOption = False,
    json_out: Annotated[bool, typer.Option("--json", help="The whole result as one JSON object on stdout.")] = False,
    report: Annotated[Optional[Path], typer.Option("--report", metavar="FILE", help="Also write the JSON result to this file (atomically; missing directories are created).")] = None,
    target: TargetOption = None,
    draft: DraftOption = None,
    drafter: DrafterOption = None,
    dtype: DtypeOption = None,
    models: ModelsOption = None,
    threads: ThreadsOption = None,
    accept: AcceptOption = "exact",
    engine: Annotated[Optional[str], typer.Option("--engine", metavar="ENGINE", help="Check a serving engine instead of this loop: 'vllm' or 'llama.cpp' starts a plain and a --spec server (docs/engines.md).")] = None,
    spec_mode: Annotated[Optional[str], typer.Option("--spec", metavar="ngram:K|draft:K|eagle3:K", help="With --engine: the speculative configuration checked: prompt lookup (llama.cpp: ngram:K is ngram-mod; ngram-simple:K and the other types by name), the pair's draft model, or its head exported as EAGLE-3.")] = None,
    server: Annotated[Optional[str], typer.Option("--server", metavar="URL", help="Check a speculative OpenAI-compatible server already running at URL against --reference (API key from $SPECDEC_API_KEY).")] = None,
    reference: Annotated[Optional[str], typer.Option("--reference", metavar="URL", help="With --server: the plain server whose greedy tokens (and top-2 logprobs) are the reference.")] = None,
    concurrency: ConcurrencyOption = None,
    batch: Annotated[int, typer.Option("--batch", metavar="N", help=f"Decode the speculative runs N prompts at once (1 to {MAX_BATCH}), as `generate --batch N` does: each prompt must still equal its own plain decoding (1: one at a time).")] = 1,
) -> None:
    """Prove that speculative decoding gives the target's own output, token for token.

    Every prompt is decoded plainly, by transformers' generate, and with speculation at each K.
    Each divergence is located and classified by the target's logit margin: a `numerical
    near-tie` (round-off between a 1-token and a (K+1)-token forward) or a `mismatch` (a bug).
    With --sampling N, a seed fixes the sampled text: N seeds per prompt are sampled plainly and
    at each K, and must agree token for token (divergences classified the same way). Under
    another --accept rule (standard, a lossy one) the seed fixes no text that plain sampling shares:
    each K's draws are tested against transformers' sampler as plain sampling's are.

    With --engine vllm|llama.cpp --spec ngram:K (or --server URL --reference URL) it checks a
    serving engine: the speculative server's greedy token ids against the plain server's at
    concurrency 1 and every --concurrency level, divergences classified by the plain server's top-2
    logprob margin, and plain asked twice (a divergence where plain itself varies is not
    speculation's alone); it fails when the speculative server drafted nothing.

    Exit codes: 0 equivalent; 1 not (see the README); 2 bad input; 3 the result was printed but
    --report could not be written.
    """
    check_count("--max-new-tokens", max_new_tokens, 1)
    check_threads(threads)
    check_number("--tolerance", tolerance, 0, above=True)
    if engine or server or reference:  # a serving engine's speculative output against its plain output: commands/engine_verify.py
        refuse_given(("k", "tree", "draws", "temperature", "seed", "drafter", "dtype", "accept", "batch"),
                     "applies to this loop's check, not to a serving engine's (--engine, --server)")
        return engine_verify(engine=engine, server=server, reference=reference, spec_text=spec_mode, prompts=prompts,
                             concurrency=concurrency, max_new_tokens=max_new_tokens, tolerance=tolerance, strict=strict,
                             raw=raw, json_out=json_out, report=report, models=models, pair=pair, target=target,
                             draft=draft, threads=threads)
    refuse_given(("spec_mode", "concurrency"), "applies to a serving engine's check: give --engine or --server")
    if draws < 0:
        raise UserError(f"--sampling must be 0 (off) or a number of draws, got {draws}")
    check_batch(batch)
    if draws:
        check_number("--temperature", temperature, LEAST_TEMPERATURE)
    check_seed(seed, draws, f"--sampling {draws}")
    if report:
        check_writable(report, "--report", ours=own_files.verify_report)
    ks = parse_k_list(tree, "--tree", least=1) if tree is not None else parse_k_list(k)
    rule = accept_rule(accept)  # a lossy rule runs, shows its divergences, and exits 1
    items = read_file(prompts)
    spec = resolve_pair(models, pair, target, draft, drafter, dtype)
    if tree is not None:
        check_tree_drafter(spec)

    thread_policy.apply(threads)  # before torch loads
    from ..decoding.loaded_pair import load_pair
    from ..measure.equivalence import check_greedy
    from ..measure.sampling_check import check_sampling
    from ..measure.verdict import decide
    from ..pairs.tokenization import encode_prompt

    interrupt.now("loading the pair")
    runtime = load_pair(spec)
    if tree is not None:
        runtime.drafter = runtime.tree_drafter()
    runtime.engine.check_batch(batch)
    interrupt.now("verifying", "nothing was written: the verdict and --report come at the end")
    encoded = [(item.id, encode_prompt(runtime.tokenizer, item.text, raw)) for item in items]
    check_fit(items, [ids for _, ids in encoded], runtime.engine.context_length)
    tolerance = tolerance or _tolerance(runtime)

    started = time.perf_counter()
    steps = len(encoded) * len(ks) + (min(SAMPLING_PROMPTS, len(encoded)) * (len(ks) + 1) if draws else 0)  # check_sampling's steps
    with _progress(steps) as step:
        greedy = check_greedy(runtime.engine, runtime.tokenizer, encoded, ks, max_new_tokens, tolerance, step, rule, batch)
        sampled = (check_sampling(runtime.engine, runtime.tokenizer, encoded, ks, draws, temperature, seed, step, rule,
                                  tolerance) if draws else None)
    equivalent, verdict = decide(greedy, sampled, strict, rule)
    result = dict(pair=spec.name, drafter=runtime.drafter.name, tree=tree is not None, dtype=runtime.target.precision,
                  computed_by=runtime.target.computed_by(),
                  prompts=len(encoded), batch=batch, strict=strict, lossless=rule.lossless, accept=str(rule), equivalent=equivalent, verdict=verdict,
                  wall_s=round(time.perf_counter() - started, 3), **greedy.as_dict(),
                  sampling=sampled.as_dict() if sampled else None)
    if json_out:
        print(json.dumps(result, ensure_ascii=False), flush=True)
    else:
        render(plain_console(), greedy, sampled, equivalent, verdict, result["wall_s"], "tree" if tree is not None else "K")
    text = json.dumps(result, ensure_ascii=False, indent=2) + "\n"
    if report and not write_output("--report", report, lambda: write_atomically(report, text)):
        raise typer.Exit(WRITE_FAILED)
    raise typer.Exit(0 if equivalent else 1)


def _tolerance(runtime) -> float:
    """By the target's dtype; int8/int4 round activations to 8 bits (specdec's kernel) or bfloat16 (torch's)."""
    precision = runtime.target.precision
    from ..measure.equivalence import default_tolerance

    if precision in ("int8", "int4", "gguf"):  # weight-only kernels: bfloat16's margin
        return NEAR_TIE_TOLERANCE["bfloat16"]
    return default_tolerance(runtime.target.model.dtype)


def _progress(total: int):
    """A progress bar over prompts × K on stderr, only when stderr is a terminal; yields a step callback."""
    console = stderr_console()
    if not console.is_terminal:
        return nullcontext(lambda _: None)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console, transient=True)

    class _Bar:
        def __enter__(self):
            bar.start()
            task = bar.add_task("verifying", total=total)
            return lambda description: bar.update(task, advance=1, description=description)

        def __exit__(self, *exc):
            bar.stop()

    return _Bar()


def render(console: Console, greedy: GreedyResult, sampled: SamplingResult | None, equivalent: bool, verdict: str, wall_s: float,
           unit: str = "K") -> None:
    from ..measure.equivalence import MISMATCH

    totals = greedy.totals()
    flagged = {(d.prompt_id, d.k): d.kind for d in greedy.divergences}
    for k in greedy.ks:
        table = Table(title=f"{unit} = {k}", title_justify="left", box=box.SIMPLE_HEAD)
        table.add_column("prompt", min_width=8, overflow="fold")
        for column in ("tokens\nplain/spec", "rounds\nplain/spec", "accepted\ndrafts", "seconds\nplain/spec", "speedup",
                       "same as\nplain", "same as\ntransformers"):
            table.add_column(column, justify="right", no_wrap=True)
        for row in (r for r in greedy.rows if r.k == k):
            p, s = row.plain, row.speculative
            same = "[green]yes[/]" if row.identical else f"[red]{flagged.get((row.prompt_id, k), MISMATCH)}[/]"
            table.add_row(Text(str(row.prompt_id)), f"{p.new_tokens}/{s.new_tokens}", f"{p.rounds}/{s.rounds}",
                          f"{s.acceptance_rate:.0%}", f"{p.wall_s:.2f}/{s.wall_s:.2f}", _speedup(p.wall_s, s.wall_s),
                          same, "yes" if row.identical_to_transformers else "[red]no[/]")
        t = totals[k]
        table.add_section()
        table.add_row("total", f"{t['plain_tokens']}/{t['speculative_tokens']}", f"{t['plain_rounds']}/{t['speculative_rounds']}",
                      f"{t['acceptance_rate']:.0%}", f"{t['plain_s']:.2f}/{t['speculative_s']:.2f}",
                      _speedup(t["plain_s"], t["speculative_s"]), f"{t['identical']}/{t['prompts']}",
                      f"{sum(r.identical_to_transformers for r in greedy.rows if r.k == k)}/{t['prompts']}")
        console.print(table)
    if greedy.divergences:
        _divergences(console, "divergences (margin = logit[plain token] − logit[other token])", greedy.divergences)
    if sampled is not None and sampled.runs:  # none where the rule is not the race: its draws are tested by distribution
        table = Table(title=f"sampling: seeds against plain sampling, {unit} by {unit}", title_justify="left", box=box.SIMPLE_HEAD)
        for column in ("prompt", unit, "same as plain"):
            table.add_column(column)
        for r in sampled.runs:
            same = f"{r.identical}/{r.draws}"
            table.add_row(Text(str(r.prompt_id)), str(r.k), same if r.identical == r.draws else f"[red]{same}[/]")
        console.print(table)
    if sampled is not None:
        if sampled.divergences:
            _divergences(console, "sampled divergences (margin of the race's scores, in logits)", sampled.divergences)
        whose = "plain" if sampled.raced else "plain and speculative"
        table = Table(title=f"sampling: {whose} draws against transformers' sampler", title_justify="left", box=box.SIMPLE_HEAD)
        for column in ("prompt", "draws", "outcome", "distinct", "p-value"):
            table.add_column(column)
        for t in sampled.tests:
            table.add_row(Text(str(t.prompt_id)), t.draws, t.statistic, str(t.outcomes), f"{t.p_value:.4g}")
        console.print(table)
        console.print(f"{sampled.n} seeds of {SAMPLING_TOKENS} tokens at temperature {sampled.temperature:g}; "
                      f"{sampled.drafted} draft tokens proposed, {sampled.accepted} accepted; permutation test, "
                      f"{sampled.rounds} shufflings; threshold {sampled.threshold:.3g} (alpha {sampled.alpha:g} over {len(sampled.tests)} tests)")
    style = "bold green" if equivalent else "bold red"
    console.print(Text(verdict, style=style).append(f" ({wall_s:.1f} s)", style="dim"), soft_wrap=True)


def _divergences(console: Console, title: str, divergences) -> None:
    from ..measure.equivalence import NEAR_TIE

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    seeded = any(d.seed is not None for d in divergences)
    for column in ("prompt", "against", *(("seed",) if seeded else ()), "position", "plain token", "other token",
                   "margin plain", "margin other", "class"):
        table.add_column(column)
    for d in divergences:
        against = f"K={d.k}" if d.k is not None else d.against
        style = "yellow" if d.kind == NEAR_TIE else "red"
        table.add_row(Text(str(d.prompt_id)), against, *((str(d.seed),) if seeded else ()), str(d.position),
                      Text(f"{d.plain_token} {d.plain_text!r}"), Text(f"{d.other_token} {d.other_text!r}"),
                      _num(d.margin_plain), _num(d.margin_other), f"[{style}]{d.kind}[/]" + ("" if d.reproduced else " (rerun differed)"))
    console.print(table)


def _speedup(plain_s: float, spec_s: float) -> str:
    return f"{plain_s / spec_s:.2f}×" if spec_s > 0 else "-"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.3g}"
