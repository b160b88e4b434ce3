"""Where the adaptive controller's estimates start (adaptive.py): a calibration profile's scenario
section, else the pair's K, the drafter's recorded acceptance and guesses; and prompt lookup's
acceptance by draft position, which no profile measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...pairs.profile import ScenarioProfile
from .estimates import SIBLING_PRIOR

# A free drafter's acceptance by draft position until its rounds say otherwise (Prior.free_rates).
FREE_RATES = {"lookup": (0.83, 0.88, 0.90, 0.92), "lookup-2": (0.45, 0.55, 0.80, 0.76), "lookup-1": (0.19, 0.52, 0.56, 0.79),
              "recycle": (0.74, 0.69, 0.89, 0.92), "recycle-2": (0.44, 0.55, 0.68, 0.77),
              "recycle-1": (0.24, 0.47, 0.59, 0.71), "suffix": (0.77, 0.90, 0.96, 0.96), "suffix-3": (0.40, 0.31, 0.18),
              "suffix-2": (0.16, 0.35), "store": (0.52, 0.63, 0.73, 0.77), "store-3": (0.37, 0.41, 0.39),
              "store-2": (0.29, 0.34)}


@dataclass(frozen=True)
class Prior:
    """Where the estimates start: a profile's scenario section, or guesses when there is none."""

    k: int
    alpha: float
    c: float
    verify_cost: dict[int, float] = field(default_factory=dict)
    block_cost: dict[int, float] = field(default_factory=dict)  # K → verify cost from the block-cost cache
    siblings: tuple[float, ...] = SIBLING_PRIOR  # acceptance of a tree's rank-1, 2, 3 children

    @classmethod
    def from_section(cls, section: ScenarioProfile, block_cost: dict[int, float] | None = None,
                     siblings: tuple[float, ...] | None = None) -> "Prior":
        return cls(section.k, section.alpha, section.c, dict(section.verify_cost), dict(block_cost or {}),
                   siblings or SIBLING_PRIOR)

    @classmethod
    def guess(cls, k: int, model_drafter: bool, alpha: float | None = None) -> "Prior":
        """No calibration: trust the pair's K, and the drafter's own acceptance on unseen prompts where
        its metadata records one (``expected_alpha``), else assume speculation pays until rounds say
        otherwise (a model or head drafts at about a fifth of a target forward per token on a CPU).
        An optimistic guess costs every prompt its first rounds: a weak head drafting on and on."""
        return cls(k, 0.7 if alpha is None else alpha, 0.2 if model_drafter else 0.0)

    @staticmethod
    def free_rates(name: str) -> tuple[float, ...] | None:
        """A free drafter beside a learned one, which the profile does not measure: its acceptance
        by draft position (the chance draft i is kept given those before were), soon replaced; None
        for a drafter that is not free.

        FREE_RATES holds rates replayed on the default target's plain answers, at every step where
        the drafter had a draft to offer (benchmarks/free_drafter_priors.py; docs/notebook.md,
        "Drafters that learn as they run" and "Figures that were in the code's docstrings"). A draft
        is kept more often the stronger the evidence behind it (a longer lookup or memory match, a
        successor the target chose more times in a row), so each kind has one entry per strength:
        pooled, a two-token match would draft like a long one. The store's rates were replayed
        without the prompts whose answers it holds. On chat-like prompts the first guesses are
        weaker; the per-scenario estimates learn that.
        """
        return FREE_RATES.get(name)

    def cost(self, k: int) -> float:
        """Verify cost of K drafts (a tree's K is its node count): the profile's, else the block-cost
        cache's, else the largest known one plus 0.12 per token (a CPU-like slope), else 1 + 0.12·K."""
        costs = {**self.block_cost, **self.verify_cost}
        if k in costs:
            return costs[k]
        known = [m for m in costs if m < k]
        if known:
            top = max(known)
            return costs[top] + 0.12 * (k - top)
        return 1.0 + 0.12 * k
