"""How many draft rows a batched step verifies: K by batch size.

Alone, a draft row is cheap beside the weights a token reads, so speculation pays wherever the draft
is often right. In a batch the forward already has a row per answer; each draft row adds its share of
the arithmetic, and once the rows make the forward compute-bound a draft row costs what an answer's
own row costs while it yields less than a token. So a step's rows are chosen for the batch as a
whole: starting from one row per answer, the next draft row goes to the answer whose next draft is
most worth its cost (a learned drafter's forward, on top of the row), as long as the step's
expected tokens per second still rise. A full batch drafts
little or nothing by itself; a batch of one drafts as its schedule plans.

Weighing is not free: every answer's free drafters look for a match and its controller plans, each
step, and the rows granted are priced by a model of the forward's cost. So each batch size also
keeps what its steps were seen to cost a token when they weighed and when they did not, and takes
the cheaper, trying the other now and then (``Weighing``).
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


class Weighing:
    """Whether a batched step of ``size`` answers weighs drafts at all, by what each choice was seen to
    cost: per size, the seconds an emitted token took in the steps that weighed (deciding, drafting,
    the forward with its draft rows, accepting) and in those that decoded plainly, smoothed. Until
    each choice has been seen ``least`` times the two alternate; then a step takes the cheaper (a tie
    weighs), and every ``explore``-th step the other. Such a probe counts alone, not smoothed: one
    step that pays turns the size over at once, as when answers that repeat their prompts join a
    batch that had stopped drafting. Only steps without prompts joining are timed: a prompt's rows
    would be charged to whichever choice met them."""

    def __init__(self, least: int = 3, explore: int = 8, smoothing: float = 0.2):
        self.least, self.explore, self.smoothing = least, explore, smoothing
        self.seconds: dict[tuple[int, bool], float] = {}  # (size, weighed) -> smoothed seconds a token
        self.seen: dict[tuple[int, bool], int] = {}
        self.steps: dict[int, int] = {}

    def weighs(self, size: int) -> bool:
        """Whether this step of ``size`` answers weighs drafts."""
        steps = self.steps[size] = self.steps.get(size, 0) + 1
        if min(self.seen.get((size, True), 0), self.seen.get((size, False), 0)) < self.least:
            return self.seen.get((size, True), 0) <= self.seen.get((size, False), 0)
        cheaper = self.seconds[size, True] <= self.seconds[size, False]
        return cheaper if steps % self.explore else not cheaper

    def observe(self, size: int, weighed: bool, seconds: float, tokens: int) -> None:
        """A step of ``size`` answers that took ``seconds`` and emitted ``tokens``."""
        key, other = (size, weighed), (size, not weighed)
        self.seen[key] = self.seen.get(key, 0) + 1
        probe = self.seen.get(other, 0) >= self.least and self.seconds.get(key, 0.0) > self.seconds[other]
        self.seconds[key] = seconds / tokens if probe else smooth(self.seconds.get(key), seconds / tokens, self.smoothing)
