"""`specdec calibrate-k --batch N,N,...`: the K table by batch size and the batch size where each K stops
paying, measured on the calibration prompts in this loop as `bench --batch` measures them
(measure/batch_bench.py), printed, in --json, and kept in the profile's settings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from rich.console import Console

if TYPE_CHECKING:
    from ..decoding.loaded_pair import LoadedPair
    from ..measure.loop_bench import Mode
    from ..pairs.registry import DrafterSpec
    from ..prompts import Prompt

BATCH_HELP = ("Also measure the K table by batch size: plain decoding and the pair's drafter at each K measured, at "
              "these batch sizes (1 always included), every prompt as one job decoded that many at once as `generate "
              "--batch N` does, each prompt's tokens checked against plain decoding's at batch 1. Printed with the "
              "batch size where each K stops paying, in --json under \"batch\", and with --write in the profile "
              "(settings.batch). Lossless rules only; generation plans a batch's rows from its own measured costs.")


def batch_modes(drafter: DrafterSpec, ks: list[int]) -> list[Mode]:
    """Plain decoding, then the pair's drafter as the pair runs it at each K above 0."""
    from ..measure.loop_bench import Mode
    from ..measure.mode_kinds import running_kind

    kind = running_kind(drafter.kind, drafter.lookup)
    return [Mode("plain"), *(Mode(kind, k) for k in ks if k)]


def measure_batches(runtime: LoadedPair, prompts: list[Prompt], encoded: list[list[int]], modes: list[Mode],
                    sizes: list[int], max_new_tokens: int, sampling, seed: int,
                    report: Callable[[int, int], None]) -> dict:
    """bench --batch's figures for ``modes`` at ``sizes``; ``report(done, total)`` after each prompt's job."""
    from ..measure.batch_bench import measure
    from ..measure.loop_bench import Bench

    total, done = len(prompts) * len(modes) * len(sizes), [0]

    def progress() -> None:
        done[0] += 1
        report(done[0], total)

    return measure(Bench(runtime, max_new_tokens, sampling, seed), modes, prompts, encoded, sizes, progress)


def profile_setting(batch: dict) -> dict:
    """What the profile keeps of the measurement: the sizes, the K table and the break-even sizes."""
    return {key: batch[key] for key in ("sizes", "k_by_batch_size", "break_even_batch")}


def print_batches(console: Console, batch: dict) -> None:
    from ..measure import batch_figures

    console.print(batch_figures.table(batch, "by batch size (× over plain at that size)"))
    for line in batch_figures.summary_lines(batch):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def warn_differing(console: Console, batch: dict, greedy: bool) -> None:
    """Modes whose tokens moved from plain decoding's at batch 1, named (greedy, as bench names them)."""
    from ..measure.batch_figures import differing

    moved = differing(batch)
    if moved and greedy:
        console.print(f"[yellow]modes whose tokens differ from plain decoding at batch 1: {', '.join(moved)}[/]")
