"""The one harness of this package's timed experiments (the loop bench's modes, calibration's K
values): a warm-up that counts for nobody, then every arm on every trial, the arms' order rotated by
one place from trial to trial, so that drift of a shared machine (another job, a clock that slows)
falls on every arm alike and no arm always runs first."""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

Trial = TypeVar("Trial")
Arm = TypeVar("Arm")


def rotated(arms: Sequence[Arm], turn: int) -> list[Arm]:
    """The arms in order, starting from the one at ``turn`` (modulo their number)."""
    shift = turn % len(arms)
    return [*arms[shift:], *arms[:shift]]


def run_interleaved(trials: Sequence[Trial], arms: Sequence[Arm], run: Callable[[Trial, Arm], None],
                    warm_up: Callable[[], None] = lambda: None,
                    progress: Callable[[int, int], None] | None = None) -> None:
    """``warm_up()``, then ``run(trial, arm)`` for every arm on every trial in ``rotated`` order;
    ``progress(done, total)`` after each run."""
    warm_up()
    total, done = len(trials) * len(arms), 0
    for turn, trial in enumerate(trials):
        for arm in rotated(arms, turn):
            run(trial, arm)
            done += 1
            if progress:
                progress(done, total)
