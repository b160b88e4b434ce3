"""How many draft rows a batched step verifies: K by batch size.

Alone, a draft row is cheap beside the weights a token reads, so speculation pays wherever the draft
is often right. In a batch the forward already has a row per answer; each draft row adds its share of
the arithmetic, and once the rows make the forward compute-bound a draft row costs what an answer's
own row costs while it yields less than a token. So a step's rows are chosen for the batch as a
whole: starting from one row per answer, the next draft row goes to the answer whose next draft is
most worth its cost (a learned drafter's forward, on top of the row), as long as the step's
expected tokens per second still rise. A full batch drafts little or nothing by itself; the few
answers left at a job's end, or a batch of one, draft as their schedules plan.

What a step costs is learnt from the batch's own forwards (``StepCosts``), by what makes it cost: its
answers, its rows past each answer's first, and the positions its rows attend. By its row count alone,
the rows of a few long answers at a job's end were priced as a full batch's short ones.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

MIN_STEPS = 8  # steps seen, with two counts of further rows among them, before a step's costs are trusted
FEATURES = 4  # step_features' entries


def batch_lengths(gains: Sequence[Sequence[float] | None], base_s: float, row_s: Sequence[float],
                  draft_s: Sequence[float] | None = None) -> list[int | None]:
    """Per answer the drafts to verify: ``gains[i][j]`` is answer i's expected tokens from a round
    with j drafts (``gains[i][0]`` its one token without any; None: the answer's plan is kept as it is
    and costs nothing to weigh, its rows counted in ``base_s``); ``base_s``: seconds of the step
    without a weighed draft; ``row_s[i]``: seconds a draft row of answer i adds to it; ``draft_s[i]``:
    seconds answer i's drafter takes a drafted token (0: free, a lookup). Greedy on the marginal
    draft: added while it raises the step's tokens per second."""
    draft_s = draft_s or [0.0] * len(gains)
    lengths = [0 if g is not None else -1 for g in gains]
    tokens = sum(g[0] if g is not None else 1.0 for g in gains)  # a kept plan yields a token at least
    seconds = base_s
    while True:
        best, best_rate = None, 0.0
        for i, g in enumerate(gains):
            if g is not None and lengths[i] + 1 < len(g):
                gain = g[lengths[i] + 1] - g[lengths[i]]
                rate = (tokens + gain) / (seconds + row_s[i] + draft_s[i])
                if best is None or rate > best_rate:
                    best, best_rate = i, rate
        if best is None or best_rate <= tokens / seconds:
            return [max(n, 0) if g is not None else None for n, g in zip(lengths, gains)]
        g = gains[best]
        tokens += g[lengths[best] + 1] - g[lengths[best]]
        seconds += row_s[best] + draft_s[best]
        lengths[best] += 1


def attended(rows: int, past: int) -> int:
    """Positions a causal block of ``rows`` after ``past`` cached ones attends, over its rows."""
    return rows * past + rows * (rows + 1) // 2


def step_features(blocks: Sequence[tuple[int, int]]) -> np.ndarray:
    """A step's cost drivers, from its blocks' (rows, cached positions): 1, answers, rows past each
    answer's first, thousands of positions attended."""
    rows = sum(r for r, _ in blocks)
    return np.array([1.0, len(blocks), rows - len(blocks), sum(attended(r, p) for r, p in blocks) / 1000])


class StepCosts:
    """Seconds of a batched step: a fixed part, a part per answer (its first row, and the bookkeeping
    of its own cache and attention in every layer), a part per further row, a part per thousand
    positions attended. Least squares over every step seen, each coefficient kept ≥ 0 (noise must not
    make a row, an answer or a context pay time back)."""

    def __init__(self):
        self.gram = np.zeros((FEATURES, FEATURES))
        self.moment = np.zeros(FEATURES)
        self.steps = 0
        self._fit: np.ndarray | None = None

    def observe(self, blocks: Sequence[tuple[int, int]], seconds: float) -> None:
        x = step_features(blocks)
        self.gram += np.outer(x, x)
        self.moment += x * seconds
        self.steps += 1
        self._fit = None

    def known(self) -> bool:
        """Enough steps, and two counts of further rows among them (their sums of counts and squares say
        so exactly: integers in float64), without which a further row's cost cannot be told apart."""
        return self.steps >= MIN_STEPS and self.gram[2, 2] * self.gram[0, 0] > self.gram[0, 2] ** 2

    def seconds(self, blocks: Sequence[tuple[int, int]]) -> float:
        """A step of these blocks' (rows, cached positions)."""
        return float(self.coefficients() @ step_features(blocks))

    def row_s(self, past: int) -> float:
        """What one more row of an answer with ``past`` positions cached adds to a step."""
        c = self.coefficients()
        return float(c[2] + c[3] * (past + 1) / 1000)

    def coefficients(self) -> np.ndarray:
        """The fit, each coefficient ≥ 0: a negative one is held at 0 and the rest fitted again."""
        if self._fit is None:
            free = list(range(FEATURES))
            fit = np.zeros(FEATURES)
            while free:
                sub = np.linalg.lstsq(self.gram[np.ix_(free, free)], self.moment[free], rcond=None)[0]
                if (sub >= 0).all():
                    fit[free] = sub
                    break
                free.pop(int(np.argmin(sub)))
            self._fit = fit
        return self._fit
