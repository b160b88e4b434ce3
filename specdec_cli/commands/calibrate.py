"""`specdec calibrate-k`: measure every K on the user's prompts, per scenario, and say which K pays."""

# torch and transformers are imported inside the command bodies, so that --help and bad options answer without them.
from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..runtime import threads as thread_policy
from . import interrupt
from . import own_files
from ..atomic import check_writable
from ..decoding.control.speedup import SPECULATE
from ..decoding.rules import check_tree_rule
from ..errors import UserError
from ..limits import MAX_K
from ..pairs.profile import k_values, profile_path, read_profiles, write_profile
from ..prompts import check_fit, read_file
from .bench_batch import batch_sizes
from .calibrate_batch import BATCH_HELP, batch_modes, measure_batches, print_batches, profile_setting, warn_differing
from .common import (
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
    ThreadsOption,
    TreeBudgetsOption,
    accept_rule,
    check_count,
    check_seed,
    check_threads,
    check_tree_drafter,
    check_sampling_options,
    parse_k_list,
    plain_console,
    resolve_pair,
    sampling_params,
    stderr_console,
    user_errors,
    write_output,
)

if TYPE_CHECKING:
    from ..measure.calibration import ScenarioResult


@user_errors
def calibrate_k(
    prompts: PromptsOption,
    pair: PairOption = None,
    k: Annotated[str, typer.Option("--k", "-k", metavar="KS", help=f"K values to measure: a range like 0..8 or a list like 0,2,4 (0..{MAX_K}; 0 is always measured).")] = "0..8",
    max_new_tokens: MaxNewTokensOption = 128,
    temperature: Annotated[float, typer.Option("--temperature", metavar="T", help="0 decodes greedily; above 0 measures speculative sampling.")] = 0.0,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Random seed for sampling.")] = 0,
    raw: RawOption = False,
    write: Annotated[bool, typer.Option("--write", help="Write the result into the profile file (only this pair's section changes).")] = False,
    profile: Annotated[Optional[str], typer.Option("--profile", metavar="FILE", help="Profile file for --write (missing directories are created). Default: the pair's `profile:` key, else $SPECDEC_PROFILE, else ~/.config/specdec/profile.yaml.")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", metavar="FILE", help="Write a PNG of speed-up and acceptance against K per scenario (missing directories are created).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object on stdout instead of tables.")] = False,
    target: TargetOption = None,
    draft: DraftOption = None,
    drafter: DrafterOption = None,
    dtype: DtypeOption = None,
    tree: TreeBudgetsOption = None,
    batch: Annotated[Optional[str], typer.Option("--batch", metavar="N,N,...", help=BATCH_HELP)] = None,
    models: ModelsOption = None,
    threads: ThreadsOption = None,
    accept: AcceptOption = "exact",
) -> None:
    """Measure acceptance and speed at every K on your prompts and pick K per scenario.

    Every prompt runs at every K (K=0 is plain decoding), interleaved so that a busy machine slows
    all K alike. Per scenario it reports acceptance, per-position acceptance, costs, measured and
    predicted speed-up, the best K, its break-even acceptance rate, and a verdict: speculate or off.
    With --batch, also the K table by batch size and where speculation stops paying.

    Exit codes: 0 done; 2 bad input; 3 the result was printed but --profile or --plot could not be
    written.
    """
    check_sampling_options(temperature, 0, 1.0)
    check_count("--max-new-tokens", max_new_tokens, 1)
    check_threads(threads)
    check_seed(seed)
    if profile and not write:
        raise UserError("--profile names the file for --write; add --write")
    sizes = batch_sizes(batch, 1, accept)  # before accept_rule warns of a lossy rule that --batch refuses
    rule = accept_rule(accept)
    budgets = parse_k_list(tree, "--tree", least=1) if tree is not None else []
    if budgets:
        check_tree_rule(rule)
    if write and not rule.raced:  # standard keeps more drafts than the race that -k auto runs: its K overstates
        what = "lossy rule" if not rule.lossless else "rule"
        raise UserError(f"--write keeps K for the default rule (exact), which -k auto runs; a K measured under the {what} {rule} is not written")
    if plot:
        check_writable(plot, "--plot", ours=own_files.image)
        _check_plotting()
    items = read_file(prompts)
    spec = resolve_pair(models, pair, target, draft, drafter, dtype)
    if budgets:
        check_tree_drafter(spec)
    destination = check_writable(profile_path(profile, spec), "--profile", ours=own_files.profile) if write else None
    if destination is not None:
        read_profiles(destination)  # a damaged profile stops us now, not after the measuring

    thread_policy.apply(threads)  # before torch loads
    from ..decoding.engine import SpeculativeEngine
    from ..decoding.loaded_pair import load_pair
    from ..measure.calibration import (
        DEFAULT_SCENARIO,
        summarise_all,
        sweep,
        to_profile,
        tree_findings,
        tree_setting,
    )
    from ..pairs.tokenization import encode_prompt

    ks = parse_ks(k)
    sampling = sampling_params(temperature, 0, 1.0)
    console = stderr_console()
    interrupt.now("loading the pair")
    with console.status(f"loading {spec.name}…") if console.is_terminal else nullcontext():
        runtime = load_pair(spec)
    if sizes:
        runtime.engine.check_batch(sizes[-1])  # before the measuring: a target that batches nothing is refused now
    interrupt.now("measuring", "nothing was written: the profile and the tables come at the end")
    tree_engine = None
    if budgets:
        tree_engine = SpeculativeEngine(runtime.target.model, runtime.tree_drafter(), runtime.eos_token_ids, runtime.block_plan)
    encoded = [(item.scenario or DEFAULT_SCENARIO, encode_prompt(runtime.tokenizer, item.text, raw)) for item in items]
    check_fit(items, [ids for _, ids in encoded], runtime.engine.context_length)
    with _progress(console, len(ks) + len(budgets)) as report:
        measured = sweep(runtime.engine, encoded, ks, max_new_tokens, sampling, seed, report, rule, budgets, tree_engine)
    batches = None
    if sizes:
        modes = batch_modes(spec.drafter, ks)
        with _progress(console, len(modes)) as report:
            batches = measure_batches(runtime, items, [ids for _, ids in encoded], modes, sizes, max_new_tokens,
                                      sampling, seed, report)
    scenarios, overall = summarise_all(measured)
    trees = tree_findings(measured, scenarios)

    # The files first, each failure one line; the result goes to stdout either way.
    written, failed = None, False
    if destination is not None:
        settings = dict(prompts=str(prompts), prompt_count=len(items), k=k, max_new_tokens=max_new_tokens,
                        temperature=temperature, threads=thread_policy.policy(threads))
        if trees:
            settings["tree"] = tree_setting(measured, trees, {**scenarios, "overall": overall})
        if batches:
            settings["batch"] = profile_setting(batches)
        pair_profile = to_profile(spec, scenarios, overall, settings, runtime.target.computed_by())
        if write_output("--profile", destination, lambda: write_profile(destination, pair_profile)):
            written = str(destination)
        else:
            failed = True
    if plot:
        from ..measure.plot import plot_calibration

        failed |= not write_output("--plot", plot, lambda: plot_calibration(scenarios, plot, spec.name))
    if json_out:
        result = _as_json(spec.name, runtime.drafter.name, ks, scenarios, overall, written, rule)
        result["computed_by"] = runtime.target.computed_by()
        if trees:
            result["trees"] = {name: [{key: _round(value) for key, value in vars(f).items()} for f in figures]
                               for name, figures in trees.items()}
        if batches:
            result["batch"] = batches
        print(json.dumps(result, ensure_ascii=False))
    else:
        _print_tables(plain_console(), scenarios, overall, len(scenarios) > 1, not rule.lossless)
        if trees:
            _print_trees(plain_console(), trees, {**scenarios, "overall": overall}, len(scenarios) > 1)
        if batches:
            print_batches(plain_console(), batches)
    if batches:
        warn_differing(console, batches, sampling.greedy)
    if written:
        console.print(f"wrote the profile of {spec.name} to {written}")
    if failed:
        raise typer.Exit(WRITE_FAILED)


def _progress(console: Console, per_prompt: int):
    """A progress bar on a terminal; otherwise one plain line on stderr per finished prompt."""
    if not console.is_terminal:
        def report(done: int, total: int) -> None:
            if done % per_prompt == 0 or done == total:
                console.print(f"specdec calibrate-k: {done}/{total} runs")

        return nullcontext(report)

    class Reporter(Progress):
        def __call__(self, done: int, total: int) -> None:
            self.update(self.task, completed=done, total=total)

    reporter = Reporter(TextColumn("calibrating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console, transient=True)
    reporter.task = reporter.add_task("runs", total=None)
    return reporter


def _check_plotting() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("--plot needs matplotlib: pip install matplotlib") from None


def _scenario_json(result: ScenarioResult) -> dict:
    v = result.verdict
    return {
        "best_k": v.best_k,
        "verdict": v.verdict,
        "k": v.k,
        "speedup": round(v.speedup, 4),
        "break_even_alpha": None if result.break_even_alpha is None else round(result.break_even_alpha, 4),
        "prompts": result.prompts,
        "alpha": round(result.alpha, 4),
        "c": round(result.c, 5),
        "per_k": [{name: _round(value) for name, value in vars(f).items() if name not in LOSSY_ONLY or value is not None}
                  for f in result.per_k],
    }


def _as_json(pair, drafter, ks, scenarios, overall, written, rule) -> dict:
    return {
        "pair": pair,
        "drafter": drafter,
        "lossless": rule.lossless,
        "accept": str(rule),
        "ks": ks,
        "scenarios": {name: _scenario_json(result) for name, result in scenarios.items()},
        "overall": _scenario_json(overall),
        "profile": written,
    }


def _round(value):
    if isinstance(value, float):
        return round(value, 5)
    if isinstance(value, list):
        return [_round(v) for v in value]
    return value


def _print_tables(console: Console, scenarios: dict[str, ScenarioResult], overall: ScenarioResult, with_overall: bool,
                  lossy: bool = False) -> None:
    for result in list(scenarios.values()) + ([overall] if with_overall else []):
        title = f"{result.name} · {result.prompts} prompt(s)" + (" · LOSSY rule for K > 0" if lossy else "")
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for column in COLUMNS + (LOSSY_COLUMNS if lossy else ()):
            table.add_column(column, justify="left" if column == "per position" else "right")
        for f in result.per_k:
            best = f.k == result.verdict.best_k
            table.add_row(
                str(f.k), _fmt(f.alpha, ".2f"), _fmt(f.acceptance_rate, ".0%"),
                " ".join(f"{p:.0%}" for p in f.per_position[:4]) + (" …" if len(f.per_position) > 4 else ""),
                f"{f.accepted_per_round:.2f}", f"{f.tokens_per_round:.2f}", str(f.rounds), str(f.new_tokens),
                _fmt(None if f.draft_s_per_token is None else f.draft_s_per_token * 1000, ".2f"), _fmt(f.c, ".3f"),
                f"{f.verify_cost:.2f}", f"{f.tokens_per_s:.1f}",
                f"[bold]{f.speedup:.2f}×[/]" if best else f"{f.speedup:.2f}×", _fmt(f.predicted_speedup, ".2f", "×"),
                *((_fmt(f.length_ratio, ".2f", "×"), _fmt(f.nll, ".3f")) if lossy else ()),
            )
        console.print(table)
        console.print(_verdict_line(result), highlight=False)


COLUMNS = ("K", "α", "accepted", "per position", "acc/rd", "tok/rd", "rounds", "tokens", "draft ms/tok", "c", "verify",
           "tok/s", "speed-up", "predicted")
LOSSY_COLUMNS = ("length", "NLL")  # beside speed, what a lossy rule's K costs: completion length over K=0's, target NLL/token
LOSSY_ONLY = {"length_ratio", "nll"}


def _print_trees(console: Console, trees: dict, results: dict, with_overall: bool) -> None:
    """Per scenario, the swept tree budgets beside the best chain's speed-up."""
    for name, figures in trees.items():
        if name == "overall" and not with_overall:
            continue
        chain = results[name].verdict
        table = Table(title=f"{name} · trees (the head's; best chain K {chain.best_k} at {chain.speedup:.2f}×)",
                      title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        for column in ("N", "nodes/rd", "tok/rd", "rounds", "tok/s", "speed-up", "rank 1/2/3 kept"):
            table.add_column(column, justify="right")
        best = max(figures, key=lambda f: f.speedup)
        for f in figures:
            speed = f"{f.speedup:.2f}×"
            table.add_row(str(f.budget), f"{f.mean_nodes:.2f}", f"{f.tokens_per_round:.2f}", str(f.rounds),
                          f"{f.tokens_per_s:.1f}", f"[bold]{speed}[/]" if f is best else speed,
                          " ".join(f"{r:.0%}" for r in f.siblings))
        console.print(table)


def _verdict_line(result: ScenarioResult) -> str:
    v = result.verdict
    even = ("predicted not to pay even at α=1" if result.break_even_alpha is None
            else f"break-even α {result.break_even_alpha:.2f}")
    colour = "green" if v.verdict == SPECULATE else "yellow"
    advice = f"use K={v.best_k}" if v.verdict == SPECULATE else "plain decoding is faster: speculation off"
    best = next((f for f in result.per_k if f.k == v.best_k), None)
    base = next((f for f in result.per_k if f.k == 0), None)
    cost = ""
    if best and base and best.k and best.nll is not None:  # a lossy rule: what that speed costs
        cost = (f"; [bold yellow]lossy[/]: length {best.length_ratio:.2f}× and NLL {best.nll:.3f} vs {base.nll:.3f} "
                f"nats/token at K=0")
    return (f"{result.name}: best K {v.best_k} ({v.speedup:.2f}× over K=0; measured α {result.alpha:.2f}, {even}{cost}) "
            f"→ [bold {colour}]{v.verdict}[/] ({advice})\n")


def _fmt(value, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def parse_ks(text: str) -> list[int]:
    """--k: the K values to measure, 0 (the plain-decoding baseline) always among them."""
    try:
        ks = k_values(text)
    except ValueError as exc:
        raise UserError(f"--k {exc}") from None
    if any(not 0 <= k <= MAX_K for k in ks):
        raise UserError(f"--k values must be from 0 to {MAX_K}; got {text!r}")
    return sorted({0, *ks})
