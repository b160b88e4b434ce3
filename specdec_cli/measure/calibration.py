"""Measuring K: every prompt run at every K, folded per scenario into the figures that decide K.

Runs are interleaved by the package's one harness (interleaved.py: for each prompt, every K in an
order rotated by the prompt's index), so drift of a shared machine hits all K alike; one warm-up run
is excluded. The figures come from
round events only, so the engine needs no timing hooks. The decision itself (best K, verdict,
break-even) is the pure math of ``speedup.py``.

Under a lossy acceptance rule every K > 0 runs with it, and each output is also scored by the target
(its NLL, outside the timed region), so the chosen K shows its length and quality beside its speed.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

from ..decoding.acceptance import AcceptRule, SamplingParams
from ..decoding.engine import RoundEvent, SpeculativeEngine
from ..decoding.events import RoundCounts
from ..decoding.control.estimates import Acceptance
from ..decoding.control.speedup import Verdict, break_even_alpha, choose, fill_verify_costs
from ..decoding.tree import judgements
from ..errors import UserError
from ..pairs.manifest import libraries, source_version
from ..pairs.profile import PairProfile, ScenarioProfile, drafter_identity, drafter_name, section_name
from ..pairs.registry import PairSpec
from ..serving.stats import percentile
from .interleaved import run_interleaved
from .lossy import target_nll

DEFAULT_SCENARIO = "default"  # prompts without a `scenario` field


@dataclass(kw_only=True)
class Tally(RoundCounts):
    """Sums over the rounds of one scenario at one K (or, for block timings, over all K)."""

    runs: int = 0
    wall_s: float = 0.0
    offered: list[int] = field(default_factory=list)  # rounds that drafted position i
    kept: list[int] = field(default_factory=list)  # rounds where draft position i survived
    nll: float | None = None  # the target's NLL of the outputs, summed (lossy rules only)
    drafts: Acceptance = field(default_factory=lambda: Acceptance(0.0, weight=0.0, memory=1.0))  # by position
    lengths: Counter = field(default_factory=Counter)  # rounds per number of tokens drafted
    rank_kept: Counter = field(default_factory=Counter)  # tree rounds: children of sibling rank r kept
    rank_judged: Counter = field(default_factory=Counter)  # … and judged

    def add(self, event: RoundEvent) -> None:
        super().add(event)
        n = len(event.drafted)
        self.lengths[n] += 1
        if n and event.parents is not None:
            for _, rank, kept in judgements((-1, *event.parents), event.path or [], event.token is not None):
                self.rank_kept[rank] += kept
                self.rank_judged[rank] += 1
        elif n:
            self.drafts.observe(event.accepted, n)
        for counts, upto in ((self.offered, n), (self.kept, event.accepted)):
            counts.extend([0] * (upto - len(counts)))
            for i in range(upto):
                counts[i] += 1

    def merge(self, other: "Tally") -> None:
        super().merge(other)
        self.runs, self.wall_s = self.runs + other.runs, self.wall_s + other.wall_s
        if other.nll is not None:
            self.nll = (self.nll or 0.0) + other.nll
        self.lengths.update(other.lengths)
        self.rank_kept.update(other.rank_kept)
        self.rank_judged.update(other.rank_judged)
        self.drafts.hits = [a + b for a, b in zip(self.drafts.hits, other.drafts.hits)]
        self.drafts.trials = [a + b for a, b in zip(self.drafts.trials, other.drafts.trials)]
        for mine, theirs in ((self.offered, other.offered), (self.kept, other.kept)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, count in enumerate(theirs):
                mine[i] += count

    def predicted_tokens_per_s(self) -> float:
        """Tokens per second the model predicts: each round's expected yield from acceptance by
        position (rounds as long as they really drafted), over the measured time."""
        expected = sum(count * self.drafts.expected(n) for n, count in self.lengths.items())
        return expected / self.wall_s if self.wall_s else 0.0

    @property
    def alpha(self) -> float:
        """Per-token acceptance: kept drafts over drafts the target actually judged.

        Drafts after the first rejection in a round are never judged; counting them (as the
        plain acceptance rate does) would understate α in the speed-up formula.
        """
        return self.accepted / self.judged if self.judged else 0.0


@dataclass
class Measurements:
    """Raw tallies of one calibration: per scenario, per K, and verify time per block size."""

    ks: list[int]
    per_k: dict[str, dict[int, Tally]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(Tally)))
    blocks: dict[str, dict[int, list[float]]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    trees: list[int] = field(default_factory=list)  # tree budgets swept beside K (the head's trees)
    per_tree: dict[str, dict[int, Tally]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(Tally)))

    def record(self, scenario: str, k: int, events: list[RoundEvent], wall_s: float, nll: float | None = None,
               tree: bool = False) -> None:
        if tree:  # its own tally; its blocks are tree-masked and stay out of the chains' verify costs
            tally = self.per_tree[scenario][k]
            tally.runs += 1
            tally.wall_s += wall_s
            for event in events:
                tally.add(event)
            return
        tally = self.per_k[scenario][k]
        tally.runs += 1
        tally.wall_s += wall_s
        if nll is not None:
            tally.nll = (tally.nll or 0.0) + nll
        for event in events:
            tally.add(event)
            self.blocks[scenario][len(event.drafted) + 1].append(event.verify_s)

    def overall(self) -> tuple[dict[int, Tally], dict[int, list[float]]]:
        per_k: dict[int, Tally] = defaultdict(Tally)
        blocks: dict[int, list[float]] = defaultdict(list)
        for scenario in self.per_k:
            for k, tally in self.per_k[scenario].items():
                per_k[k].merge(tally)
            for size, times in self.blocks[scenario].items():
                blocks[size] += times
        return per_k, blocks


def sweep(
    engine: SpeculativeEngine,
    prompts: list[tuple[str, list[int]]],
    ks: list[int],
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    rule: AcceptRule = AcceptRule(),
    trees: list[int] | None = None,
    tree_engine: SpeculativeEngine | None = None,
) -> Measurements:
    """Run every (scenario, prompt ids) at every K, and with ``tree_engine`` (the head drafting trees)
    at every tree budget, by the one harness (interleaved.py: a warm-up, the order rotated per
    prompt); under a lossy ``rule``, score each output's NLL after its timed run."""
    if not prompts:
        raise UserError("no prompts to calibrate on")
    trees = list(trees or []) if tree_engine is not None else []
    result = Measurements(ks, trees=trees)

    def warm_up() -> None:  # first-call costs (allocations, caches) stay out of the figures
        for k in (max(ks), 0):
            _run(engine, prompts[0][1], k, min(max_new_tokens, 16), sampling, seed, rule)
        if trees:
            _run(tree_engine, prompts[0][1], max(trees), min(max_new_tokens, 16), sampling, seed)

    def one(prompt: tuple[str, list[int]], arm: tuple[SpeculativeEngine, int, bool]) -> None:
        (scenario, ids), (runner, k, tree) = prompt, arm
        events, wall_s = _run(runner, ids, k, max_new_tokens, sampling, seed, rule)
        nll = None if rule.lossless or tree else target_nll(engine.target, ids, [t for e in events for t in e.emitted])
        result.record(scenario, k, events, wall_s, nll, tree)

    runs = [(engine, k, False) for k in ks] + [(tree_engine, n, True) for n in trees]
    run_interleaved(prompts, runs, one, warm_up, progress)
    return result


def _run(engine, ids, k, max_new_tokens, sampling, seed, rule=AcceptRule()) -> tuple[list[RoundEvent], float]:
    started = time.perf_counter()
    events = list(engine.generate(ids, k=k, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed, rule=rule))
    return events, time.perf_counter() - started


@dataclass
class KFigures:
    k: int
    alpha: float | None
    acceptance_rate: float | None
    per_position: list[float]
    accepted_per_round: float
    tokens_per_round: float
    rounds: int
    new_tokens: int
    draft_s_per_token: float | None
    c: float | None
    verify_cost: float
    tokens_per_s: float
    speedup: float
    predicted_speedup: float | None
    length_ratio: float | None = None  # completion length over K=0's (lossy rules only)
    nll: float | None = None  # the target's mean NLL per token of the outputs (lossy rules only)


@dataclass
class ScenarioResult:
    name: str
    prompts: int
    per_k: list[KFigures]
    verdict: Verdict
    break_even_alpha: float | None
    alpha: float  # pooled over every K > 0
    c: float
    verify_cost: dict[int, float]


def summarise(name: str, per_k: dict[int, Tally], blocks: dict[int, list[float]], ks: list[int]) -> ScenarioResult:
    """Turn one scenario's tallies into figures, predictions and a verdict."""
    one = _median(blocks.get(1, [])) or _mean_verify(per_k.get(0))
    observed = {size - 1: _median(times) / one for size, times in blocks.items() if times and one}
    costs = fill_verify_costs(observed, ks)
    pooled = Tally()
    for k, tally in per_k.items():
        if k > 0:
            pooled.merge(tally)
    c = (pooled.draft_s / pooled.drafted / one) if pooled.drafted and one else 0.0
    base = per_k[0].new_tokens / per_k[0].wall_s if 0 in per_k and per_k[0].wall_s else 0.0
    figures = []
    for k in ks:
        tally = per_k.get(k, Tally())
        tps = tally.new_tokens / tally.wall_s if tally.wall_s else 0.0
        k_c = (tally.draft_s / tally.drafted / one) if tally.drafted and one else (c if k else None)
        figures.append(KFigures(
            k=k,
            alpha=tally.alpha if k else None,
            acceptance_rate=(tally.accepted / tally.drafted if tally.drafted else 0.0) if k else None,
            per_position=[(tally.kept[i] if i < len(tally.kept) else 0) / n for i, n in enumerate(tally.offered)],
            accepted_per_round=tally.accepted / tally.rounds if tally.rounds else 0.0,
            tokens_per_round=tally.new_tokens / tally.rounds if tally.rounds else 0.0,
            rounds=tally.rounds,
            new_tokens=tally.new_tokens,
            draft_s_per_token=tally.draft_s / tally.drafted if tally.drafted else None,
            c=k_c,
            verify_cost=costs[k],
            tokens_per_s=tps,
            speedup=tps / base if base else 0.0,
            predicted_speedup=(tally.predicted_tokens_per_s() / base if base else None) if k else 1.0,
            length_ratio=(tally.new_tokens / per_k[0].new_tokens if 0 in per_k and per_k[0].new_tokens else None)
            if tally.nll is not None else None,
            nll=tally.nll / tally.new_tokens if tally.nll is not None and tally.new_tokens else None,
        ))
    verdict = choose({f.k: f.speedup for f in figures})
    best = next((f for f in figures if f.k == verdict.best_k), None)
    even = break_even_alpha(best.k, best.c or 0.0, best.verify_cost) if best and best.k else None
    prompts = per_k[0].runs if 0 in per_k else 0
    return ScenarioResult(name, prompts, figures, verdict, even, pooled.alpha, c, {k: costs[k] for k in ks if k})


def summarise_all(measured: Measurements) -> tuple[dict[str, ScenarioResult], ScenarioResult]:
    """Per-scenario results in first-seen order, and the overall one."""
    scenarios = {name: summarise(name, measured.per_k[name], measured.blocks[name], measured.ks) for name in measured.per_k}
    overall = summarise("overall", *measured.overall(), measured.ks)
    return scenarios, overall


def _median(values: list[float]) -> float:
    """Verify times by block size: the median, since a busy machine adds rare long outliers (the
    reports' one percentile, serving/stats.py); 0 for none."""
    return percentile(values, 50) or 0.0


def _mean_verify(tally: Tally | None) -> float:
    return tally.verify_s / tally.rounds if tally and tally.rounds else 0.0


def to_profile(pair: PairSpec, scenarios: dict[str, ScenarioResult], overall: ScenarioResult, settings: dict,
               computed_by: dict | None = None) -> PairProfile:
    """What `--write` keeps of a calibration: per scenario the K to start from and the estimates
    the adaptive controller starts with, plus when, with what models, kernels and library versions."""
    versions = {"target": source_version(pair.target.source)}
    if pair.drafter.model:
        versions["draft"] = source_version(pair.drafter.model.source)
    versions.update(libraries())
    return PairProfile(
        pair=section_name(pair),
        calibrated=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        target=str(pair.target.source),
        dtype=pair.target.dtype,
        draft=drafter_name(pair),
        scenarios={name: _section(result) for name, result in scenarios.items()},
        overall=_section(overall),
        versions=versions,
        settings=settings,
        drafter=drafter_identity(pair),
        computed_by=computed_by or {},
    )


def _section(result: ScenarioResult) -> ScenarioProfile:
    v = result.verdict
    return ScenarioProfile(k=v.k, verdict=v.verdict, best_k=v.best_k, speedup=round(v.speedup, 4),
                           alpha=round(result.alpha, 4), c=round(result.c, 5),
                           verify_cost={k: round(cost, 4) for k, cost in result.verify_cost.items()})


@dataclass
class TreeFigures:
    """One tree budget in one scenario, beside the chains: what it kept per round and its speed."""

    budget: int
    mean_nodes: float  # draft nodes verified per round
    tokens_per_round: float
    rounds: int
    new_tokens: int
    tokens_per_s: float
    speedup: float  # over K = 0 of the same scenario, same run
    siblings: list[float]  # acceptance of the rank-1, 2, 3 children (pooled over depths)


def summarise_trees(per_tree: dict[int, Tally], plain: Tally | None, budgets: list[int]) -> list[TreeFigures]:
    base = plain.new_tokens / plain.wall_s if plain and plain.wall_s else 0.0
    figures = []
    for n in budgets:
        tally = per_tree.get(n, Tally())
        tps = tally.new_tokens / tally.wall_s if tally.wall_s else 0.0
        figures.append(TreeFigures(
            budget=n,
            mean_nodes=tally.drafted / tally.rounds if tally.rounds else 0.0,
            tokens_per_round=tally.new_tokens / tally.rounds if tally.rounds else 0.0,
            rounds=tally.rounds, new_tokens=tally.new_tokens, tokens_per_s=tps,
            speedup=tps / base if base else 0.0,
            siblings=sibling_rates(tally),
        ))
    return figures


def sibling_rates(tally: Tally, ranks: int = 3) -> list[float]:
    """Kept over judged, per sibling rank 1..ranks (0 where none was judged)."""
    return [tally.rank_kept[r] / tally.rank_judged[r] if tally.rank_judged[r] else 0.0 for r in range(1, ranks + 1)]


def tree_findings(measured: Measurements, scenarios: dict[str, ScenarioResult]) -> dict[str, list[TreeFigures]]:
    """Per scenario (and overall), every swept tree budget's figures; {} when none were swept."""
    if not measured.trees:
        return {}
    found = {name: summarise_trees(measured.per_tree[name], measured.per_k[name].get(0), measured.trees)
             for name in measured.per_tree}
    pooled_trees: dict[int, Tally] = defaultdict(Tally)
    pooled_plain = Tally()
    for name in measured.per_tree:
        for n, tally in measured.per_tree[name].items():
            pooled_trees[n].merge(tally)
        if 0 in measured.per_k[name]:
            pooled_plain.merge(measured.per_k[name][0])
    found["overall"] = summarise_trees(pooled_trees, pooled_plain, measured.trees)
    return found


def tree_setting(measured: Measurements, found: dict[str, list[TreeFigures]], results: dict[str, ScenarioResult]) -> dict:
    """What the profile keeps of a tree sweep (under its settings, ``tree``): per scenario the best
    budget, its speed-up and tokens per round, whether it beat the best chain, and the sibling
    acceptance over every budget's rounds, which seeds the adaptive controller (``controller.sibling_prior``)."""
    kept = {}
    for name, figures in found.items():
        pooled = Tally()
        for scenario, tallies in measured.per_tree.items():
            if name in ("overall", scenario):
                for tally in tallies.values():
                    pooled.merge(tally)
        best = max(figures, key=lambda f: f.speedup)
        chain = results[name].verdict.speedup if name in results else None
        kept[name] = {"best": best.budget, "speedup": round(best.speedup, 4),
                      "tokens_per_round": round(best.tokens_per_round, 4),
                      "beats_chain": None if chain is None else bool(best.speedup > chain),
                      "siblings": [round(r, 4) for r in sibling_rates(pooled)]}
    return {"budgets": list(measured.trees), "scenarios": kept}
