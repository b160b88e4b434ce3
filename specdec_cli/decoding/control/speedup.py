"""The speed-up model of speculative decoding, as small pure functions.

Units: time is counted in one-token target forwards. With per-token acceptance α (the chance that
a draft token survives, given that the ones before it did), a round with K drafts emits on average
(1 − α^(K+1)) / (1 − α) tokens and costs verify_cost(K) + K·c, where verify_cost(K) is a
(K+1)-token forward relative to a 1-token one and c is the drafter's cost per drafted token.
Plain decoding (K = 0) emits one token per unit, so the ratio of the two is the speed-up
(Leviathan et al., 2023). Calibration prints it next to the measured speed-up; the adaptive
controller maximises it round by round.
"""

from __future__ import annotations

from dataclasses import dataclass

SPECULATE, OFF = "speculate", "off"


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one round emits on average: accepted drafts plus the target's own token."""
    if k <= 0:
        return 1.0
    alpha = min(max(alpha, 0.0), 1.0)
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def predicted_speedup(alpha: float, k: int, c: float, verify_cost: float) -> float:
    """(1 − α^(K+1)) / ((1 − α)(verify_cost(K) + K·c)); 1 for K = 0 by definition."""
    if k <= 0:
        return 1.0
    return expected_tokens(alpha, k) / (verify_cost + k * c)


def break_even_alpha(k: int, c: float, verify_cost: float, tolerance: float = 1e-6) -> float | None:
    """The acceptance rate at which K drafts per round exactly pay for themselves.

    None when even α = 1 cannot pay (a round costs more than K + 1 plain steps); the predicted
    speed-up rises with α, so bisection finds the crossing.
    """
    if k <= 0:
        return None
    if predicted_speedup(1.0, k, c, verify_cost) < 1.0:
        return None
    if predicted_speedup(0.0, k, c, verify_cost) >= 1.0:
        return 0.0
    low, high = 0.0, 1.0
    while high - low > tolerance:
        middle = (low + high) / 2
        if predicted_speedup(middle, k, c, verify_cost) >= 1.0:
            high = middle
        else:
            low = middle
    return high


@dataclass(frozen=True)
class Verdict:
    """The best speculative K by measured speed-up, and whether speculating at all pays."""

    best_k: int
    speedup: float
    verdict: str  # SPECULATE or OFF

    @property
    def k(self) -> int:
        """The K to run with: the best K when speculation pays, else 0 (plain decoding)."""
        return self.best_k if self.verdict == SPECULATE else 0


def choose(speedups: dict[int, float]) -> Verdict:
    """Pick the K > 0 with the highest measured speed-up over K = 0; `off` when it is below 1.

    Ties go to the larger K (more tokens per round for the same speed).
    """
    candidates = {k: s for k, s in speedups.items() if k > 0}
    if not candidates:
        return Verdict(0, 1.0, OFF)
    best = max(candidates, key=lambda k: (candidates[k], k))
    return Verdict(best, candidates[best], SPECULATE if candidates[best] >= 1.0 else OFF)


def fill_verify_costs(observed: dict[int, float], ks: list[int]) -> dict[int, float]:
    """Relative verify cost for every K in ``ks``: observed where measured, otherwise linear
    interpolation between neighbours (or extrapolation from the last two, never decreasing).

    A drafter that often proposes fewer than K tokens (n-gram lookup) leaves block sizes unseen.
    """
    known = dict(sorted({0: 1.0, **{k: v for k, v in observed.items() if v > 0}}.items()))
    points = sorted(known)
    filled = {}
    for k in ks:
        if k in known:
            filled[k] = known[k]
            continue
        lower = max((p for p in points if p < k), default=None)
        upper = min((p for p in points if p > k), default=None)
        if upper is not None and lower is not None:
            share = (k - lower) / (upper - lower)
            filled[k] = known[lower] + share * (known[upper] - known[lower])
        else:  # beyond the largest observed block
            below = [p for p in points if p < k][-2:]
            slope = (known[below[-1]] - known[below[0]]) / (below[-1] - below[0]) if len(below) == 2 else 0.0
            filled[k] = known[below[-1]] + max(slope, 0.0) * (k - below[-1])
    return filled
