"""One adaptive controller per scenario (adaptive.AdaptiveK), seeded from the pair's calibration
profile, or from the pair's K and its drafter's recorded acceptance where no profile covers it.
"""

from __future__ import annotations

from typing import Callable

from ...pairs.profile import PairProfile
from ...pairs.free_kinds import FREE_KINDS
from ...pairs.registry import MODEL, NGRAM, PairSpec
from .adaptive import DEFAULT_K_MAX, AdaptiveK
from .estimates import SIBLING_PRIOR
from .priors import Prior


class AdaptiveController:
    """One AdaptiveK per scenario, seeded from the pair's profile; a new profile re-seeds them.

    ``trees``: the main drafter (a draft head) may also draft trees, weighed against its chains.
    ``block_cost``: verify costs by K from the block-cost cache (blocks.relative_costs), for the
    block sizes the profile did not measure (a tree's, mostly). ``context_cost``: seconds each cached
    token adds to a verify block, by K (blocks.context_slopes), so that every estimate is made for
    the context the round verifies over.
    """

    def __init__(self, fallback_k: Callable[[str | None], int], model_drafter: bool,
                 profile: PairProfile | None = None, k_max: int = DEFAULT_K_MAX, main: str = MODEL,
                 trees: bool = False, block_cost: dict[int, float] | None = None, alpha: float | None = None,
                 gating: bool = True, context_cost: dict[int, float] | None = None):
        self.fallback_k, self.model_drafter, self.k_max, self.main = fallback_k, model_drafter, k_max, main
        self.gating, self.context_cost = gating, dict(context_cost or {})
        self.alpha = alpha  # the drafter's recorded acceptance, for scenarios no profile covers
        self.profile, self.trees, self.block_cost = profile, trees, dict(block_cost or {})
        # Per scenario, one AdaptiveK per answer decoded at once (batched decoding), each a prompt at a time.
        self.schedules: dict[str | None, list[AdaptiveK]] = {}

    @classmethod
    def for_pair(cls, pair: PairSpec, profile: PairProfile | None, trees: bool = False,
                 block_cost: dict[int, float] | None = None, alpha: float | None = None,
                 gating: bool = True, context_cost: dict[int, float] | None = None) -> "AdaptiveController":
        """Without a profile, the pair's K per scenario and the drafter's recorded α are the best
        starting point there is. A drafter of a free kind (free_kinds.py) is guessed to cost nothing to
        draft, whether or not the priors know its name."""
        return cls(pair.k_for, pair.drafter.kind not in FREE_KINDS, profile, main=main_name(pair.drafter.kind),
                   trees=trees, block_cost=block_cost, alpha=alpha, gating=gating, context_cost=context_cost)

    def reseed(self, profile: PairProfile | None) -> None:
        self.profile = profile
        self.schedules.clear()

    def schedule(self, scenario: str | None) -> AdaptiveK:
        """The scenario's controller, counters reset for a new prompt: one that plans no answer now (a
        batch runs several at once), or a new one."""
        lanes = self.schedules.setdefault(scenario, [])
        schedule = next((s for s in lanes if not s.running), None)
        if schedule is None:
            section = self.profile.for_scenario(scenario) if self.profile else None
            siblings = sibling_prior(self.profile, scenario)
            if section:
                prior = Prior.from_section(section, self.block_cost, siblings)
            else:
                guess = Prior.guess(self.fallback_k(scenario), self.model_drafter, self.alpha)
                prior = Prior(guess.k, guess.alpha, guess.c, block_cost=self.block_cost, siblings=siblings or SIBLING_PRIOR)
            schedule = AdaptiveK(prior, self.k_max, main=self.main, trees=self.trees, gating=self.gating,
                                 context_cost=self.context_cost)
            lanes.append(schedule)
        schedule.begin()
        return schedule


def main_name(kind: str) -> str:
    """The name a pair's own drafter of this kind is kept under (AdaptiveK's ``main``): the source its
    drafts carry, a free drafter's on its strongest match. That is its kind's name, but for prompt
    lookup (kind ``ngram``), whose drafts say ``lookup`` (drafters/lookup.lookup_source)."""
    return "lookup" if kind == NGRAM else kind


def sibling_prior(profile: PairProfile | None, scenario: str | None) -> tuple[float, ...] | None:
    """The acceptance of a tree's rank-1, 2, 3 children that calibrate-k measured (kept in the profile's
    settings under ``tree``: per scenario, ``siblings``), or None."""
    found = (profile.settings.get("tree") or {}) if profile else {}
    scenarios = found.get("scenarios") if isinstance(found, dict) else None
    if not isinstance(scenarios, dict):
        return None
    section = scenarios.get(scenario or "default") or scenarios.get("overall") or {}
    values = section.get("siblings") if isinstance(section, dict) else None
    try:
        return tuple(min(max(float(v), 0.0), 1.0) for v in values) if values else None
    except (TypeError, ValueError):
        return None
