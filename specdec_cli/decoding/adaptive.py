"""Adaptive K: a KSchedule that tracks acceptance and costs online and picks K round by round.

Per scenario it keeps running estimates of α (per-token acceptance), c (draft cost per token) and
the verify cost of each block size, seeded from the calibration profile. Before each round it
takes the K with the most expected tokens per unit time (speedup.py). When even the best K is
predicted slower than plain decoding it switches speculation off — a normal state, counted in
``rounds_off`` — and drafts a short probe every so many rounds, so that speculation comes back
once acceptance recovers. Driven by round events only: no models, no clocks, no files.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from ..pairs.profile import PairProfile, ScenarioProfile
from ..pairs.registry import PairSpec
from .engine import RoundEvent
from .speedup import predicted_speedup

DEFAULT_K_MAX = 8


@dataclass(frozen=True)
class Prior:
    """Where the estimates start: a profile's scenario section, or guesses when there is none."""

    k: int
    alpha: float
    c: float
    verify_cost: dict[int, float] = field(default_factory=dict)

    @classmethod
    def from_section(cls, section: ScenarioProfile) -> "Prior":
        return cls(section.k, section.alpha, section.c, dict(section.verify_cost))

    @classmethod
    def guess(cls, k: int, model_drafter: bool) -> "Prior":
        """No calibration: trust the pair's K and assume speculation pays until rounds say otherwise."""
        return cls(k, 0.7, 0.1 if model_drafter else 0.0)

    def cost(self, k: int) -> float:
        """Verify cost of K drafts; without a measured figure, 1 + 0.12·K (a CPU-like slope)."""
        if k in self.verify_cost:
            return self.verify_cost[k]
        known = [m for m in self.verify_cost if m < k]
        if known:
            top = max(known)
            return self.verify_cost[top] + 0.12 * (k - top)
        return 1.0 + 0.12 * k


class AdaptiveK:
    """The controller for one scenario. Its estimates persist across prompts; ``begin`` resets
    only the per-prompt counters reported in the statistics."""

    def __init__(self, prior: Prior, k_max: int = DEFAULT_K_MAX, probe_every: int = 16, probe_k: int = 2,
                 memory: float = 0.9, prior_weight: float = 8.0, margin: float = 0.05, smoothing: float = 0.2):
        self.k_max = max(k_max, prior.k, 1)
        self.probe_every, self.probe_k = probe_every, min(probe_k, self.k_max)
        self.memory, self.margin, self.smoothing = memory, margin, smoothing
        self.prior = prior
        self.prior_weight, self.rounds_seen = prior_weight, 0
        self.hits, self.judged = prior.alpha * prior_weight, prior_weight  # discounted counts behind α
        self.block_s: dict[int, float] = {}  # block size → smoothed verify seconds
        self.draft_s_per_token: float | None = None
        self.off = prior.k == 0
        self.k = prior.k if prior.k > 0 else self._best()[0]
        self.since_probe, self.probing = 0, False
        self.begin()

    # --- KSchedule -------------------------------------------------------------------------------

    def choose(self) -> int:
        self.probing = False
        if not self.off:
            return self.k
        self.since_probe += 1
        if self.since_probe >= self.probe_every:
            self.since_probe, self.probing = 0, True
            return self.probe_k
        return 0

    def observe(self, event: RoundEvent) -> None:
        drafted = len(event.drafted)
        self._smooth(self.block_s, drafted + 1, event.verify_s)
        if drafted:
            judged = event.judged
            decay = self.memory**judged
            self.hits = self.hits * decay + event.accepted
            self.judged = self.judged * decay + judged
            per_token = event.draft_s / drafted
            self.draft_s_per_token = per_token if self.draft_s_per_token is None else (
                self.draft_s_per_token + self.smoothing * (per_token - self.draft_s_per_token))
        self.k_used[event.k] += 1
        self.rounds_seen += 1
        if self.probing:
            self.probes += 1
        elif self.off and event.k == 0:
            self.rounds_off += 1
        self._decide()

    # --- estimates -------------------------------------------------------------------------------

    @property
    def alpha(self) -> float:
        return self.hits / self.judged if self.judged else 0.0

    def one_token_s(self) -> float | None:
        """Seconds of a 1-token forward: observed, or inferred from another block and the prior."""
        if 1 in self.block_s:
            return self.block_s[1]
        inferred = sorted(s / self.prior.cost(size - 1) for size, s in self.block_s.items())
        return inferred[len(inferred) // 2] if inferred else None

    def verify_cost(self, k: int) -> float:
        one = self.one_token_s()
        if one and k + 1 in self.block_s:
            return max(self.block_s[k + 1] / one, 1e-3)
        return self.prior.cost(k)

    def draft_cost(self) -> float:
        one = self.one_token_s()
        if one and self.draft_s_per_token is not None:
            return self.draft_s_per_token / one
        return self.prior.c

    def predicted(self, k: int) -> float:
        return predicted_speedup(self.alpha, k, self.draft_cost(), self.verify_cost(k))

    def _best(self) -> tuple[int, float]:
        """The K ≥ 1 with the highest predicted speed-up (the smaller K on a tie: less waste)."""
        rates = {k: self.predicted(k) for k in range(1, self.k_max + 1)}
        best = max(rates, key=lambda k: (rates[k], -k))
        return best, rates[best]

    def _decide(self) -> None:
        best, rate = self._best()
        if self.off:
            if rate > 1.0 + self.margin:  # hysteresis: come back only when clearly worth it
                self.off, self.k = False, best
        elif rate < 1.0:
            self.off, self.since_probe = True, 0
        elif rate > self.predicted(self.k) * 1.02:
            self.k = best

    def _smooth(self, table: dict[int, float], key: int, value: float) -> None:
        table[key] = value if key not in table else table[key] + self.smoothing * (value - table[key])

    # --- reporting -------------------------------------------------------------------------------

    def begin(self) -> None:
        """Start a prompt: reset its counters, and pull α halfway back to the profile's.

        Acceptance swings within an answer (copied code, then prose about it); a new prompt is a
        new context, so the last prompt's tail should not decide how the next one starts. Costs
        are properties of the machine and carry over as they are.
        """
        if self.rounds_seen:
            alpha = (self.alpha + self.prior.alpha) / 2
            self.hits, self.judged = alpha * self.prior_weight, self.prior_weight
            self._decide()
        self.rounds_off, self.probes = 0, 0
        self.k_used: Counter[int] = Counter()
        self.k_start = 0 if self.off else self.k

    def report(self) -> dict:
        """Per-prompt figures for the JSON statistics."""
        return {
            "k_start": self.k_start,
            "k_end": 0 if self.off else self.k,
            "k_used": {str(k): n for k, n in sorted(self.k_used.items())},
            "rounds_off": self.rounds_off,
            "probes": self.probes,
            "alpha_estimate": round(self.alpha, 4),
        }

    def describe(self) -> str:
        """One line for the live view."""
        if self.off:
            return f"auto: speculation off (α≈{self.alpha:.2f}), probe in {self.probe_every - self.since_probe}"
        return f"auto: K {self.k} (α≈{self.alpha:.2f})"


class AdaptiveController:
    """One AdaptiveK per scenario, seeded from the pair's profile; a new profile re-seeds them."""

    def __init__(self, fallback_k: Callable[[str | None], int], model_drafter: bool,
                 profile: PairProfile | None = None, k_max: int = DEFAULT_K_MAX):
        self.fallback_k, self.model_drafter, self.k_max = fallback_k, model_drafter, k_max
        self.profile = profile
        self.schedules: dict[str | None, AdaptiveK] = {}

    @classmethod
    def for_pair(cls, pair: PairSpec, profile: PairProfile | None) -> "AdaptiveController":
        """Without a profile, the pair's K per scenario is the best starting point there is."""
        return cls(pair.k_for, pair.drafter.model is not None, profile)

    def reseed(self, profile: PairProfile | None) -> None:
        self.profile = profile
        self.schedules.clear()

    def schedule(self, scenario: str | None) -> AdaptiveK:
        """The scenario's controller, counters reset for a new prompt."""
        if scenario not in self.schedules:
            section = self.profile.for_scenario(scenario) if self.profile else None
            prior = Prior.from_section(section) if section else Prior.guess(self.fallback_k(scenario), self.model_drafter)
            self.schedules[scenario] = AdaptiveK(prior, self.k_max)
        schedule = self.schedules[scenario]
        schedule.begin()
        return schedule
