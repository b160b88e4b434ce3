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

        Replayed on the default target's plain answers to the 93 prompts of the calibration, bench,
        random, equivalence, lossy and held-out files (every step where lookup had a match;
        benchmarks/free_drafter_priors.py): a match of three or more tokens 0.83 / 0.88 / 0.90 / 0.92
        (1,027 matches), of two 0.45 / 0.55 / 0.80 / 0.76 (333), of one 0.19 / 0.52 / 0.56 / 0.79
        (1,253; once its first guess holds, the match is longer). Taken together, two or more tokens
        gave 0.73 / 0.83 / 0.89 / 0.90, which let a two-token match draft like a long one. On
        chat-like prompts the first guesses are weaker; the per-scenario estimates learn that.

        Token recycling by how many times in a row its first guess was the target's choice
        (recycle.py), and the suffix memory by match length (suffix.py): replayed the same way, in
        the same order (one process's memory), on specdec's kernels
        (``benchmarks/results/free-drafters/priors.json``): recycling seen three times or more
        0.74 / 0.69 / 0.89 / 0.92 (359 drafts), twice 0.44 / 0.55 / 0.68 / 0.77 (380), once 0.24 /
        0.47 / 0.59 / 0.71 (2,548); the memory on a match of four or more 0.77 / 0.90 / 0.96 / 0.96
        (729), of three 0.40 / 0.31 / 0.18 (103), of two 0.16 / 0.35 (465). Lookup's, replayed
        there too, moved by at most 0.06 (its greedy answers differ on those kernels) and were kept.
        The default pair's store (store.py), replayed on the same files less the held-out ones (it
        holds their answers; ``benchmarks/results/free-drafters/store/priors.json``): a match of four
        or more 0.52 / 0.63 / 0.73 / 0.77 (1,340 drafts), of three 0.37 / 0.41 / 0.39 (569), of two
        0.29 / 0.34 (729).
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
