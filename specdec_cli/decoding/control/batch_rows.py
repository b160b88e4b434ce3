"""How many draft rows a batched step verifies: K by batch size.

Alone, a draft row is cheap beside the weights a token reads, so speculation pays wherever the draft
is often right. In a batch the forward already has a row per answer; each draft row adds its share of
the arithmetic, and once the rows make the forward compute-bound a draft row costs what an answer's
own row costs while it yields less than a token. So a step's rows are chosen for the batch as a
whole: starting from one row per answer, the next draft row goes to the answer whose next draft is
most worth its cost (a learned drafter's forward, on top of the row), as long as the step's
expected tokens per second still rise. A full batch drafts
little or nothing by itself; a batch of one drafts as its schedule plans.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .estimates import smooth


def batch_lengths(gains: Sequence[Sequence[float] | None], base_rows: int, cost: Callable[[int], float],
                  draft_s: Sequence[float] | None = None) -> list[int | None]:
    """Per answer the drafts to verify: ``gains[i][j]`` is answer i's expected tokens from a round
    with j drafts (``gains[i][0]`` its one token without any; None: the answer's plan is kept as it is
    and costs nothing to weigh, its rows counted in ``base_rows``); ``cost(n)``: seconds of a forward
    of n rows; ``draft_s[i]``: seconds answer i's drafter takes a drafted token (0: free, a lookup).
    Greedy on the marginal draft: added while it raises the step's tokens per second."""
    draft_s = draft_s or [0.0] * len(gains)
    lengths = [0 if g is not None else -1 for g in gains]
    tokens = sum(g[0] if g is not None else 1.0 for g in gains)  # a kept plan yields a token at least
    rows, drafting = base_rows, 0.0
    while True:
        best, best_rate = None, 0.0
        for i, g in enumerate(gains):
            if g is not None and lengths[i] + 1 < len(g):
                gain = g[lengths[i] + 1] - g[lengths[i]]
                rate = (tokens + gain) / (cost(rows + 1) + drafting + draft_s[i])
                if best is None or rate > best_rate:
                    best, best_rate = i, rate
        if best is None or best_rate <= tokens / (cost(rows) + drafting):
            return [max(n, 0) if g is not None else None for n, g in zip(lengths, gains)]
        g = gains[best]
        tokens += g[lengths[best] + 1] - g[lengths[best]]
        drafting += draft_s[best]
        lengths[best] += 1
        rows += 1


class RowCosts:
    """Seconds of a forward by its rows, learned from the batched forwards seen: smoothed per row
    count, interpolated between counts, extrapolated past the largest by the slope of the last two.
    None until two row counts are known: before that a step keeps its plans."""

    def __init__(self, smoothing: float = 0.2):
        self.smoothing = smoothing
        self.seconds: dict[int, float] = {}

    def observe(self, rows: int, seconds: float) -> None:
        self.seconds[rows] = smooth(self.seconds.get(rows), seconds, self.smoothing)

    def known(self) -> bool:
        return len(self.seconds) >= 2

    def cost(self, rows: int) -> float:
        if rows in self.seconds:
            return self.seconds[rows]
        counts = sorted(self.seconds)
        below = [n for n in counts if n < rows]
        above = [n for n in counts if n > rows]
        if below and above:
            a, b = below[-1], above[0]
        elif below:
            a, b = (below[-2], below[-1]) if len(below) > 1 else (below[-1], below[-1])
        else:
            a, b = (above[0], above[1]) if len(above) > 1 else (above[0], above[0])
        if a == b:
            return self.seconds[a]
        slope = max((self.seconds[b] - self.seconds[a]) / (b - a), 0.0)  # noise must not make rows free
        return max(self.seconds[a] + slope * (rows - a), min(self.seconds.values()))
