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

from ..decoding.speedup import SPECULATE
from ..errors import UserError
from ..limits import MAX_K
from ..pairs.profile import profile_path, read_profiles, write_profile
from ..prompts import read_file
from .common import (
    DrafterOption,
    DtypeOption,
    DraftOption,
    ModelsOption,
    PairOption,
    TargetOption,
    resolve_pair,
    sampling_params,
    stderr_console,
    user_errors,
)

if TYPE_CHECKING:
    from ..measure.calibration import ScenarioResult


@user_errors
def calibrate_k(
    prompts: Annotated[str, typer.Option("--prompts", help="JSONL prompts with 'prompt' and optional 'id', 'scenario' (or plain lines).")],
    pair: PairOption = None,
    k: Annotated[str, typer.Option("--k", "-k", help=f"K values to measure: a range like 0..8 or a list like 0,2,4 (0..{MAX_K}; 0 is always measured).")] = "0..8",
    max_new_tokens: Annotated[int, typer.Option(help="Most tokens to generate per prompt and K.")] = 128,
    temperature: Annotated[float, typer.Option(help="0 decodes greedily; above 0 measures speculative sampling.")] = 0.0,
    seed: Annotated[int, typer.Option(help="Random seed for sampling.")] = 0,
    raw: Annotated[bool, typer.Option("--raw", help="Send prompts as they are, without the chat template.")] = False,
    write: Annotated[bool, typer.Option("--write", help="Write the result into the profile file (only this pair's section changes).")] = False,
    profile: Annotated[Optional[str], typer.Option("--profile", help="Profile file for --write. Default: the pair's `profile:` key, else $SPECDEC_PROFILE, else ~/.config/specdec/profile.yaml.")] = None,
    plot: Annotated[Optional[str], typer.Option("--plot", help="Write a PNG of speed-up and acceptance against K per scenario.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object on stdout instead of tables.")] = False,
    target: TargetOption = None,
    draft: DraftOption = None,
    drafter: DrafterOption = None,
    dtype: DtypeOption = None,
    models: ModelsOption = None,
) -> None:
    """Measure acceptance and speed at every K on your prompts and pick K per scenario.

    Every prompt runs at every K (K=0 is plain decoding), interleaved so that a busy machine slows
    all K alike. Per scenario it reports acceptance, per-position acceptance, costs, measured and
    predicted speed-up, the best K, its break-even acceptance rate, and a verdict: speculate or off.
    """
    from ..decoding.runtime import prepare
    from ..measure.calibration import DEFAULT_SCENARIO, measure, parse_ks, summarise_all, to_profile
    from ..pairs.tokenization import encode_prompt

    sampling = sampling_params(temperature, 0, 1.0)
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    ks = parse_ks(k, MAX_K)
    items = read_file(prompts)
    spec = resolve_pair(models, pair, target, draft, drafter, dtype)
    destination = profile_path(profile, spec) if write else None
    if destination is not None:
        read_profiles(destination)  # a damaged profile stops us now, not after the measuring
    if profile and not write:
        raise UserError("--profile names the file for --write; add --write")
    if plot:
        _check_plotting()

    console = stderr_console()
    with console.status(f"loading {spec.name}…") if console.is_terminal else nullcontext():
        runtime = prepare(spec)
    encoded = [(item.scenario or DEFAULT_SCENARIO, encode_prompt(runtime.tokenizer, item.text, raw)) for item in items]
    with _progress(console, len(ks)) as report:
        measured = measure(runtime.engine, encoded, ks, max_new_tokens, sampling, seed, report)
    scenarios, overall = summarise_all(measured)

    written = None
    if destination is not None:
        settings = dict(prompts=str(prompts), prompt_count=len(items), k=k, max_new_tokens=max_new_tokens,
                        temperature=temperature)
        write_profile(destination, to_profile(spec, scenarios, overall, settings))
        written = str(destination)
    if plot:
        from ..measure.plot import plot_calibration

        plot_calibration(scenarios, Path(plot), spec.name)
    if json_out:
        print(json.dumps(_as_json(spec.name, runtime.drafter.name, ks, scenarios, overall, written), ensure_ascii=False))
    else:
        out = Console()
        if not out.is_terminal:
            out = Console(width=150)  # a file or a pipe: keep each row on one line
        _print_tables(out, scenarios, overall, len(scenarios) > 1)
    if written:
        console.print(f"wrote the profile of {spec.name} to {written}")


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
        "per_k": [{name: _round(value) for name, value in vars(f).items()} for f in result.per_k],
    }


def _as_json(pair, drafter, ks, scenarios, overall, written) -> dict:
    return {
        "pair": pair,
        "drafter": drafter,
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


def _print_tables(console: Console, scenarios: dict[str, ScenarioResult], overall: ScenarioResult, with_overall: bool) -> None:
    for result in list(scenarios.values()) + ([overall] if with_overall else []):
        table = Table(title=f"{result.name} · {result.prompts} prompt(s)", title_justify="left", box=box.SIMPLE_HEAD,
                      pad_edge=False)
        for column in COLUMNS:
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
            )
        console.print(table)
        console.print(_verdict_line(result), highlight=False)


COLUMNS = ("K", "α", "accepted", "per position", "acc/rd", "tok/rd", "rounds", "tokens", "draft ms/tok", "c", "verify",
           "tok/s", "speed-up", "predicted")


def _verdict_line(result: ScenarioResult) -> str:
    v = result.verdict
    even = ("predicted not to pay even at α=1" if result.break_even_alpha is None
            else f"break-even α {result.break_even_alpha:.2f}")
    colour = "green" if v.verdict == SPECULATE else "yellow"
    advice = f"use K={v.best_k}" if v.verdict == SPECULATE else "plain decoding is faster: speculation off"
    return (f"{result.name}: best K {v.best_k} ({v.speedup:.2f}× over K=0; measured α {result.alpha:.2f}, {even}) "
            f"→ [bold {colour}]{v.verdict}[/] ({advice})\n")


def _fmt(value, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"
