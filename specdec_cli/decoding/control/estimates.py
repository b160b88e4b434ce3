"""What the adaptive controller knows about one drafter: acceptance by draft position, and cost.

Small pure pieces, each testable alone. Acceptance is kept per position (the chance that draft
token i survives given that the ones before it did), with discounted counts so that the recent
rounds weigh most; an unseen or rarely judged position borrows the estimate of the one before it,
and position 0 the prior's. Costs are in seconds, smoothed, measured round by round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...limits import MAX_K


def per_cached_token(costs: dict[int, float], k: int) -> float:
    """Seconds a cached token adds to a verify block of K drafts (blocks.context_slopes): as measured,
    else the largest measured K's plus its last step for each K past it (a tree's block can be longer
    than any measured); 0 where nothing was measured."""
    if k in costs:
        return costs[k]
    known = sorted(m for m in costs if m < k)
    if not known:
        return 0.0
    top = known[-1]
    step = costs[top] - costs[known[-2]] if len(known) > 1 else 0.0
    return costs[top] + max(step, 0.0) * (k - top)


@dataclass
class Acceptance:
    """Discounted hits and trials per draft position, shrunk towards the position before, or
    towards ``positions[i]`` where a prior by position is known (a drafter whose first guess is
    much weaker than the ones after it, like a one-token lookup match)."""

    prior: float
    positions: tuple[float, ...] = ()
    weight: float = 1.0  # pseudo-trials of the fallback estimate behind every position
    memory: float = 0.92  # each new trial at a position discounts the old ones by this much
    hits: list[float] = field(default_factory=lambda: [0.0] * MAX_K)
    trials: list[float] = field(default_factory=lambda: [0.0] * MAX_K)

    def observe(self, accepted: int, drafted: int) -> None:
        """Positions 0..accepted-1 survived; position ``accepted`` (if drafted) was turned down;
        the ones after it were never judged and teach nothing."""
        for i in range(min(accepted + 1, drafted)):
            self.judge(i, i < accepted)

    def judge(self, position: int, kept: bool) -> None:
        if position < MAX_K:
            self.hits[position] = self.hits[position] * self.memory + kept
            self.trials[position] = self.trials[position] * self.memory + 1.0

    def rates(self, k: int) -> list[float]:
        """Conditional acceptance of positions 0..k-1."""
        rates, fallback = [], min(max(self.prior, 0.0), 1.0)
        for i in range(min(k, MAX_K)):
            if i < len(self.positions):
                fallback = min(max(self.positions[i], 0.0), 1.0)
            if self.trials[i] + self.weight > 0:  # else never judged and no prior weight: the one before
                fallback = (self.hits[i] + self.weight * fallback) / (self.trials[i] + self.weight)
            rates.append(fallback)
        return rates

    def expected(self, k: int) -> float:
        """Tokens a round with k drafts emits on average: 1 + Σ_j Π_{i≤j} a_i."""
        total, survive = 1.0, 1.0
        for rate in self.rates(k):
            survive *= rate
            total += survive
        return total

    @property
    def alpha(self) -> float:
        """Acceptance over all judged positions (the single-α figure the statistics report)."""
        trials = sum(self.trials)
        return (sum(self.hits) + self.weight * self.prior) / (trials + self.weight)

    def forget(self, share: float = 0.5) -> None:
        """Keep only ``share`` of the evidence: a new prompt is a new context."""
        self.hits = [h * share for h in self.hits]
        self.trials = [t * share for t in self.trials]


@dataclass
class Calibration:
    """How often the target keeps a drafter's guesses per unit of the drafter's own confidence in
    them: Σ kept / Σ confidence over judged draft tokens, discounted, and shrunk towards 1 (taking
    the drafter at its word) by ``weight`` pseudo-tokens until rounds say otherwise."""

    weight: float = 4.0
    memory: float = 0.98
    kept: float = 0.0
    confident: float = 0.0

    def observe(self, confidences: list[float], accepted: int) -> None:
        """The drafted tokens' confidences; the first ``accepted`` were kept, the next one (if any) not."""
        for i, value in enumerate(confidences[: accepted + 1]):
            self.kept = self.kept * self.memory + (i < accepted)
            self.confident = self.confident * self.memory + value

    @property
    def ratio(self) -> float:
        return min(max((self.kept + self.weight) / (self.confident + self.weight), 0.25), 2.0)


SIBLING_PRIOR = (0.12, 0.06, 0.04)  # ranks 1, 2, 3: a guess for a weak head (α ≈ 0.3), soon replaced


@dataclass
class Siblings:
    """Acceptance of a tree's runners-up: by depth and sibling rank (≥ 1), the chance that the target
    keeps a node's rank-r child (given the node was reached). Rank 0 is the chain's ``Acceptance``.

    Kept like ``Acceptance``: discounted counts, an unseen depth borrows the depth above, depth 1 the
    prior of its rank.
    """

    prior: tuple[float, ...] = SIBLING_PRIOR
    weight: float = 1.0
    memory: float = 0.92
    hits: dict[tuple[int, int], float] = field(default_factory=dict)
    trials: dict[tuple[int, int], float] = field(default_factory=dict)

    def judge(self, depth: int, rank: int, kept: bool) -> None:
        key = (depth, rank)
        self.hits[key] = self.hits.get(key, 0.0) * self.memory + kept
        self.trials[key] = self.trials.get(key, 0.0) * self.memory + 1.0

    def rate(self, depth: int, rank: int) -> float:
        estimate = self.prior[rank - 1] if rank - 1 < len(self.prior) else 0.0
        for d in range(1, depth + 1):
            key = (d, rank)
            estimate = (self.hits.get(key, 0.0) + self.weight * estimate) / (self.trials.get(key, 0.0) + self.weight)
        return estimate

    def forget(self, share: float = 0.5) -> None:
        self.hits = {key: h * share for key, h in self.hits.items()}
        self.trials = {key: t * share for key, t in self.trials.items()}


def smooth(old: float | None, new: float, weight: float = 0.2) -> float:
    return new if old is None else old + weight * (new - old)


def probe_wait(loss: float, failures: int, budget: float = 0.01, least: int = 4, most: int = 1024) -> int:
    """Rounds until the next probe of a drafter that is off.

    A probe round that does not pay loses ``loss`` plain rounds' worth of time; waiting
    loss / budget rounds between probes keeps what probing costs under ``budget`` of plain speed.
    Each probe that finds the drafter still not paying doubles the wait (back-off).
    """
    wait = max(loss, 0.0) / budget * 2**failures
    return int(min(max(wait, least), most))
