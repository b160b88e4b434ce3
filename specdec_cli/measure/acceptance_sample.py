"""A drafter's acceptance and cost, sampled from a few prompts (`specdec predict`): each prompt answered
plainly and at one K under each rule asked, by the one harness (interleaved.py), so that the drafter's
time and the target's one-token forward are taken side by side, under the same load."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..decoding.acceptance import SamplingParams
from ..decoding.engine import SpeculativeEngine
from ..decoding.events import RoundCounts
from ..decoding.rules import AcceptRule
from ..errors import UserError
from ..serving.stats import percentile
from .interleaved import run_interleaved
from .prediction import RoundCosts, cost_per_token


@dataclass
class Sample:
    """What the sampled answers showed: per rule, α = kept / judged (None where nothing was judged),
    and the drafter's cost per drafted token over a one-token target forward (``c``)."""

    prompts: int
    k: int
    counts: dict[str, RoundCounts] = field(default_factory=dict)  # rule → the K rounds' sums
    plain: RoundCounts = field(default_factory=RoundCounts)
    one_token_s: float = 0.0  # median seconds of a plain round's verify forward
    top_verify_s: float = 0.0  # median seconds of the verify forward of a round that drafted K
    plain_s: float = 0.0  # wall seconds of the plain answers

    def alpha(self, rule: str) -> float | None:
        counts = self.counts[rule]
        return counts.accepted / counts.judged if counts.judged else None

    @property
    def c(self) -> float:
        draft_s = sum(counts.draft_s for counts in self.counts.values())
        drafted = sum(counts.drafted for counts in self.counts.values())
        return cost_per_token(draft_s, drafted, self.one_token_s)

    def round_costs(self) -> RoundCosts:
        """What the plain rounds and the rounds at K paid, in one-token forwards: verify forwards by
        their median (a busy moment's spikes left out), bookkeeping by its mean."""
        spec = RoundCounts()
        for counts in self.counts.values():
            spec.merge(counts)
        unit, plain = self.one_token_s, self.plain
        return RoundCosts(plain=1.0 + plain.other_s / plain.rounds / unit, top_k=self.k,
                          top_verify=self.top_verify_s / unit if self.top_verify_s else None,
                          other=spec.other_s / spec.rounds / unit)

    @property
    def plain_tokens_per_s(self) -> float:
        return self.plain.new_tokens / self.plain_s if self.plain_s else 0.0


def sample(engine: SpeculativeEngine, prompts: list[list[int]], k: int, rules: list[AcceptRule], max_new_tokens: int,
           sampling: SamplingParams, seed: int = 0, progress: Callable[[int, int], None] | None = None) -> Sample:
    """Answer every prompt plainly and at K under each rule (after a warm-up that counts for nobody)."""
    if not prompts:
        raise UserError("no prompts to sample acceptance from")
    result = Sample(len(prompts), k, {str(rule): RoundCounts() for rule in rules})
    verify_times: list[float] = []
    top_times: list[float] = []  # rounds that drafted K: lookup drafts fewer where its match is short

    def run(ids: list[int], arm: tuple[int, AcceptRule]) -> None:
        arm_k, rule = arm
        started = time.perf_counter()
        events = list(engine.generate(ids, k=arm_k, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed, rule=rule))
        wall_s = time.perf_counter() - started
        counts = result.plain if arm_k == 0 else result.counts[str(rule)]
        for event in events:
            counts.add(event)
            if arm_k == 0:
                verify_times.append(event.verify_s)
            elif len(event.drafted) == arm_k:
                top_times.append(event.verify_s)
        if arm_k == 0:
            result.plain_s += wall_s

    def warm_up() -> None:
        for arm_k in (k, 0):
            list(engine.generate(prompts[0], k=arm_k, max_new_tokens=min(max_new_tokens, 8), sampling=sampling, seed=seed))

    arms = [(0, AcceptRule())] + [(k, rule) for rule in rules]
    run_interleaved(prompts, arms, run, warm_up, progress)
    result.one_token_s = percentile(verify_times, 50) or 0.0
    result.top_verify_s = percentile(top_times, 50) or 0.0
    return result
