"""A bench sample (one prompt decoded in one mode), and the figures of one mode over some prompts,
each against plain decoding on the same prompts: speed, acceptance, tokens a round, latency
percentiles, token identity, what each drafter did, and the speed-up the round model predicts from
the measured costs."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ..decoding.control.estimates import Acceptance
from ..decoding.events import RoundCounts
from ..prompts import Prompt
from ..serving.stats import percentile


@dataclass
class Sample(RoundCounts):
    """One prompt decoded in one mode."""

    prompt: Prompt
    tokens: list[int]
    wall_s: float
    ttft_s: float
    latencies: list[float]  # seconds per token after the first emission
    seed: int = 0
    nll: float | None = None  # the target's NLL of the tokens, summed (lossy runs only; lossy.score)
    correct: bool | None = None  # the task's answer found (prompts with an answer, lossy runs only)
    drafts: list[tuple[str, int, int]] = field(default_factory=list)  # per round: drafter, drafted, accepted
    by_drafter: dict[str, RoundCounts] = field(default_factory=dict)  # the rounds each drafter was asked


def figures(samples: list[Sample], plain: list[Sample]) -> dict:
    """The figures of one mode over some prompts, each relative to plain decoding on the same prompts."""
    tokens = sum(len(s.tokens) for s in samples)
    wall = sum(s.wall_s for s in samples)
    plain_tps = sum(len(s.tokens) for s in plain) / max(sum(s.wall_s for s in plain), 1e-9)
    tps = tokens / max(wall, 1e-9)
    drafted = sum(s.drafted for s in samples)
    rounds = sum(s.rounds for s in samples)
    latencies = [t for s in samples for t in s.latencies]
    return {
        "tokens_per_s": round(tps, 2),
        "speedup_vs_plain": round(tps / plain_tps, 3) if plain_tps else None,
        "acceptance_rate": round(sum(s.accepted for s in samples) / drafted, 4) if drafted else None,
        "mean_accepted_length": round(tokens / rounds, 3) if rounds else 0.0,
        "rounds": rounds,
        "completion_length": round(tokens / len(samples), 2),
        "ttft_s": round(statistics.fmean(s.ttft_s for s in samples), 4),
        **{f"p{q}_token_latency_s": round(percentile(latencies, q) or 0.0, 5) for q in (50, 90, 99)},
        "identical_to_plain": all(s.tokens == p.tokens for s, p in zip(samples, plain)),
        "wall_s": round(wall, 3),
        "fallback_forwards": sum(s.fallback_forwards for s in samples),  # off the lean forward: 0 expected
        **({"drafters": by_drafter(samples)} if any(s.by_drafter for s in samples) else {}),
    }


def by_drafter(samples: list[Sample]) -> dict[str, dict]:
    """Per drafter (its source tag), over the rounds it was asked: as generate's statistics report it."""
    found: dict[str, RoundCounts] = {}
    for sample in samples:
        for source, counts in sample.by_drafter.items():
            found.setdefault(source, RoundCounts()).merge(counts)
    return {source: counts.drafter_figures() for source, counts in sorted(found.items())}


def predicted_from_rounds(samples: list[Sample], plain: list[Sample]) -> float:
    """The speed-up the model predicts from what each round cost and drafted.

    Costs are measured, round by round (draft, verify with its sampling transform and the race,
    bookkeeping) and so is what lies outside the rounds (prefill); what the model supplies
    is the tokens: each round's expected yield from its drafter's acceptance by position over the
    run (estimates.Acceptance), where the measured figure counts the tokens the rounds really gave.
    The two agree when acceptance behaves as the model says (independent from round to round).
    """
    by_source: dict[str, Acceptance] = {}
    for sample in samples:
        for source, drafted, accepted in sample.drafts:
            if drafted:
                by_source.setdefault(source, Acceptance(0.0, weight=0.0, memory=1.0)).observe(accepted, drafted)
    expected = sum(by_source[source].expected(drafted) if drafted else 1.0
                   for sample in samples for source, drafted, _ in sample.drafts)
    wall = sum(s.wall_s for s in samples)
    plain_tps = sum(len(s.tokens) for s in plain) / max(sum(s.wall_s for s in plain), 1e-9)
    return expected / max(wall, 1e-9) / plain_tps if plain_tps else 0.0
