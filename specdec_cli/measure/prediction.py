""""Will it pay here?" as small pure functions: from a verify curve, a drafter's cost and an
acceptance rate, the predicted speed-up, the break-even acceptance and the K to choose, per K and per
lossless rule (`specdec predict`; the formula is control/speedup.py's).

The two lossless rules keep different shares of a sampling drafter's tokens at one position: the
standard rule (min(1, p/q), residual draw) keeps 1 − TV(p, q), the race that fixes the text by the
seed (decoding/coupling.py) at least (1 − TV)/(1 + TV) (benchmarks/coupling_acceptance.py measures
both). An acceptance rate known under one rule gives the other's through that relation: a bound, and
per position, not of an average, so a derived figure is labelled as such; a measured one is preferred.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..decoding.control.speedup import Verdict, break_even_alpha, choose, predicted_speedup
from ..decoding.rules import EXACT, STANDARD

RULES = (EXACT, STANDARD)  # the lossless rules, the default first
MOST_K = 9  # verify blocks are timed with up to 10 rows (decoding/blocks.MEASURED_LENGTHS): K up to 9
LEAST_CONTEXT = 64  # decoding/blocks.SHORT_CONTEXT: the padding plan's context, whose block costs are kept already


def race_alpha(standard: float) -> float:
    """The race's acceptance where the standard rule keeps ``standard`` = 1 − TV: (1 − TV)/(1 + TV)."""
    standard = min(max(standard, 0.0), 1.0)
    return standard / (2.0 - standard)


def standard_alpha(race: float) -> float:
    """The inverse of ``race_alpha``: the standard rule's 1 − TV where the race keeps ``race``."""
    race = min(max(race, 0.0), 1.0)
    return 2.0 * race / (1.0 + race)


def other_rule_alpha(alpha: float, rule: str) -> float:
    """What the other lossless rule keeps where ``rule`` keeps ``alpha``."""
    return standard_alpha(alpha) if rule == EXACT else race_alpha(alpha)


def rules_differ(temperature: float, drafter_samples: bool) -> bool:
    """Whether the two rules keep different drafts: only a drafter that samples from a q of its own (a
    model, a head), under sampling; greedy decoding and one-hot drafts (lookup) are judged alike."""
    return temperature > 0 and drafter_samples


@dataclass(frozen=True)
class KPrediction:
    """One K: what a verify block of K + 1 costs, the acceptance at which K just pays, and the speed-up."""

    k: int
    verify_cost: float  # a (K + 1)-row block over a one-row one
    break_even_alpha: float | None  # None: even α = 1 does not pay
    speedup: float


def predict(alpha: float, c: float, verify_costs: dict[int, float]) -> list[KPrediction]:
    """Per K in ``verify_costs`` (K > 0), in order: the predicted speed-up at ``alpha`` with a drafter
    costing ``c`` target forwards per drafted token, and the break-even acceptance."""
    return [KPrediction(k, cost, break_even_alpha(k, c, cost), predicted_speedup(alpha, k, c, cost))
            for k, cost in sorted(verify_costs.items()) if k > 0]


def chosen(predictions: list[KPrediction]) -> Verdict:
    """The K with the highest predicted speed-up; `off` when none beats plain decoding."""
    return choose({p.k: p.speedup for p in predictions})


@dataclass(frozen=True)
class RoundCosts:
    """What the sampled rounds paid, in one-token target forwards (the plain rounds' median verify):
    a plain round whole (its verify and bookkeeping), the verify of a round that drafted ``top_k``,
    and a speculative round's bookkeeping (cache crop, features, the schedule)."""

    plain: float
    top_k: int
    top_verify: float | None  # None: no sampled round drafted top_k (lookup found no long match)
    other: float


def round_curve(timed: dict[int, float], rounds: RoundCosts) -> dict[int, float]:
    """Per K, a speculative round's cost without its drafts, over a plain round's: the timed verify
    curve's shape (how a block's cost grows with its rows, in a tight loop) anchored at what the
    sampled rounds paid for one row and for ``top_k`` + 1 rows (in a run, between drafts and
    bookkeeping, a forward costs what a tight loop does not show), plus the round's bookkeeping.
    Where no round drafted ``top_k``, the timed curve stands as it is."""
    rise = timed[rounds.top_k] - 1.0
    paid = rise if rounds.top_verify is None else rounds.top_verify - 1.0
    curve = {}
    for k, cost in timed.items():
        share = (cost - 1.0) / rise if rise > 1e-9 else k / rounds.top_k
        curve[k] = (1.0 + share * paid + rounds.other) / rounds.plain
    return curve


def spread(items: list, count: int) -> list:
    """``count`` of ``items`` taken at even steps from the first: a sample that reaches every part of
    a file sorted by scenario, where its first lines would all be one scenario."""
    if count >= len(items):
        return list(items)
    step = len(items) / count
    return [items[int(i * step)] for i in range(count)]


def typical_context(prompt_lengths: list[int], max_new_tokens: int, least: int, most: int) -> int:
    """The cached tokens a verify block attends over, on average, while these prompts are answered:
    the mean prompt plus half an answer, rounded to a power of two (so that block costs measured once
    serve prompts of about that length), within [least, most]."""
    if not prompt_lengths:
        return least
    mean = sum(prompt_lengths) / len(prompt_lengths) + max_new_tokens / 2
    rounded = 2 ** round(math.log2(max(mean, 1.0)))
    return max(least, min(most, rounded))


def cost_per_token(draft_s: float, drafted: int, one_token_s: float) -> float:
    """A drafter's cost per drafted token in target forwards of one token; 0 when it drafted nothing."""
    return draft_s / drafted / one_token_s if drafted and one_token_s > 0 else 0.0

