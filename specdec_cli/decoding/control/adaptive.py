"""Adaptive speculation: a schedule (schedule.KSchedule) that decides each round which drafter drafts, and how much.

For one scenario (controller.py keeps one per scenario) it keeps, for every drafter it has seen
(prompt lookup on a match of two or more tokens, on a one-token match, and the learned drafter:
estimates.py), acceptance by draft position and draft cost, and for the target the verify seconds
of each block size and a round's bookkeeping (target_costs.py); all measured round by round (greedy
or sampling: the transform and the race are part of the verify time), seeded from the calibration
profile. A verify block's seconds are kept as they would be over an empty cache, and every estimate
adds what the round's context costs, so what a long prompt's rounds teach does not mislead the short
prompt after it, and the other way round.
Before each round it is shown lookup's match (free to find) and picks whichever of that match (K
capped by its length), the learned drafter, or plain decoding promises the most tokens per second.
A drafter predicted slower than plain decoding is off — it costs nothing then: no draft forward,
and the head only keeps the target's features (head.py) — and is probed now and then, as rarely as
keeps probing under 1 % of plain speed, with back-off while probes keep failing. The learned
drafter's K is a ceiling: each round a gate (gate.py), filled in from these estimates, stops it
where its own confidence says the next guess will not pay, and the gated rounds' statistics (how
far the gate lets it go) enter the estimate of what the drafter yields. Driven by round events
only: no models, no clocks, no files.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from ...limits import MAX_K
from ...pairs.registry import MODEL
from ..events import RoundCounts, RoundEvent
from ..schedule import KSchedule, Plan, Take
from ..tree import TreeShape, best_first, judgements, shape_of
from .estimates import Acceptance, Calibration, Siblings, probe_wait, smooth
from .gate import DraftGate, gated_rounds
from .priors import Prior
from .target_costs import TargetCosts

DEFAULT_K_MAX = 8
TREE_MAX = 12  # the largest tree budget weighed: verify blocks of 13 tokens, past which a CPU's cost climbs
TREE_LEVEL_COST = 1.15  # a tree level's head forward (width rows) against a chain step's, until measured


@dataclass
class Standing:
    """One drafter's standing: its estimates, the K it runs at, and whether it is on."""

    acceptance: Acceptance
    c: float  # prior draft cost per token, in one-token target forwards
    k: int
    on: bool
    draft_s_per_token: float | None = None
    siblings: Siblings = field(default_factory=Siblings)  # a tree's runners-up, by depth and rank
    level_s: float | None = None  # seconds per level of a tree draft (one head forward over the level)
    tree: int = 0  # the tree budget that beats every chain, 0 when a chain is best (or trees are not weighed)
    failures: int = 0  # probes in a row that found it still not paying
    wait: int = 0  # rounds (with it on offer) until its next probe, while off
    # Under the gate: the chance it drafts position i given it drafted those before, and how its
    # confidence translates into the target's acceptance. ``gated`` once a gated round is seen.
    passes: Acceptance = field(default_factory=lambda: Acceptance(1.0))
    calibration: Calibration = field(default_factory=Calibration)
    gated: bool = False


class AdaptiveK(KSchedule):
    """The controller for one scenario. Its estimates persist across prompts; ``begin`` resets
    only the per-prompt counters reported in the statistics and halves the acceptance evidence.

    ``main``: the pair's own drafter, by the name its drafts carry (Draft.source), which the free
    drafters' offers stand beside; the K, α and tree it reports are its."""

    reads_offer = True  # weighs the free drafters' ready drafts against the learned drafter every round

    def __init__(self, prior: Prior, k_max: int = DEFAULT_K_MAX, main: str = MODEL, probe_k: int = 2,
                 margin: float = 0.05, smoothing: float = 0.2, trees: bool = False, tree_max: int = TREE_MAX,
                 shape: TreeShape = TreeShape(TREE_MAX), gating: bool = True,
                 context_cost: dict[int, float] | None = None):
        self.k_max = max(k_max, prior.k, 1)
        self.gating = gating  # the learned drafter's chains are gated by its confidence (gate.py)
        self.prior, self.main = prior, main
        self.trees, self.tree_max, self.shape = trees, tree_max, shape  # trees: the main drafter's, weighed too
        self.probe_k, self.margin, self.smoothing = min(probe_k, self.k_max), margin, smoothing
        self.costs = TargetCosts(prior, smoothing, context_cost)
        self.standings: dict[str, Standing] = {}
        self.probing: str | None = None
        self.rounds_seen = 0
        self._standing(main)
        self.begin()

    # --- the decision ----------------------------------------------------------------------------

    def plan(self, offers: dict[str, int], learned: str | None, room: int) -> Plan:
        """This round's plan: the on-drafter with the most tokens per second if it beats plain
        decoding, else a probe that is due, else nothing. Free drafters' ready drafts are weighed
        first, in the order offered, the learned drafter last."""
        self.probing = None
        best_rate, best = self.plain_rate(), Plan.nothing()
        due = []
        for name, cap in (*offers.items(), (learned, room)):
            if not name or cap < 1:
                continue
            take = Take.OFFER if name in offers else Take.LEARNED
            standing = self._standing(name, free=take is Take.OFFER)
            if standing.on:
                # Until its own rounds say otherwise, a drafter runs at the K the profile measured best.
                untried = standing.draft_s_per_token is None and standing.level_s is None and standing.k <= cap
                k, rate = (standing.k, max(self.rate(name, standing.k), best_rate * 1.001)) if untried else self.best(name, cap)
                if rate > best_rate:
                    best_rate, best = rate, Plan(k, take, name)
                if not untried and self.weighs_trees(name):
                    nodes, tree_rate = self.best_tree(name, self.tree_max)  # paths past the budget are cut
                    if tree_rate > best_rate:
                        best_rate, best = tree_rate, Plan(nodes, Take.TREE, name)
            else:
                standing.wait -= 1
                if standing.wait <= 0:
                    due.append(Plan(min(self.probe_k, cap), take, name))
        if best.take is Take.NOTHING and due:
            self.probing = due[0].source
            return due[0]
        return best

    def context(self, cached: int) -> None:
        """The next round verifies over ``cached`` tokens: every verify estimate is made for that."""
        self.costs.context(cached)

    def gate(self, name: str, k: int) -> DraftGate | None:
        """This round's gate for a chain of at most ``k`` drafts from ``name`` (None: draft all k)."""
        if not self.gating or self.prior.free_rates(name) is not None or k < 1:
            return None
        standing = self._standing(name)
        return DraftGate(tuple(self.costs.verify_s(d) for d in range(k + 1)), self.draft_s(name, 1),
                         self.costs.overhead_s(), standing.calibration.ratio)

    def observe(self, event: RoundEvent) -> None:
        drafted = len(event.drafted)
        self.costs.observe(event)
        if event.asked:
            name = event.source or self.main
            standing = self._standing(name)
            # A head's catch-up after sitting out is paid once per gap, not per drafted token.
            drafting = max(event.draft_s - event.catchup_s - event.offer_s, 0.0)
            if event.parents is not None:
                parents = (-1, *event.parents)
                for depth, rank, kept in judgements(parents, event.path or [], event.token is not None):
                    if rank == 0:
                        standing.acceptance.judge(depth - 1, kept)
                    else:
                        standing.siblings.judge(depth, rank, kept)
                standing.level_s = smooth(standing.level_s, drafting / max(shape_of(parents)[0]), self.smoothing)
                self.trees_used[drafted] += 1
            else:
                if drafted:
                    standing.acceptance.observe(event.accepted, drafted)
                # Per drafter step: a gated draft took one step more than it drafted where the gate stopped it.
                steps = len(event.confidence) if event.confidence else drafted
                standing.draft_s_per_token = smooth(standing.draft_s_per_token, drafting / steps, self.smoothing)
                if event.confidence is not None:
                    standing.gated = True
                    standing.passes.observe(drafted, len(event.confidence))
                    standing.calibration.observe(event.confidence[:drafted], event.accepted)
                    self.declined += not drafted
            self.drafts[name].add(event)
        else:
            self.rounds_off += 1
        if event.parents is None:
            self.k_used[event.k] += 1
        self.rounds_seen += 1
        probed = self.probing if event.asked else None
        if probed:
            self.probes += 1
        # Re-weigh on new evidence only: a round that drafted, or one that ran its own forward. A shared
        # forward's seconds are not this answer's block cost (batch_rows.py prices shared rows), and in
        # a full batch most rounds share one and draft nothing.
        if event.asked or event.batch == 1:
            self._decide(probed)

    def _decide(self, probed: str | None = None) -> None:
        plain = self.plain_rate()
        for name, standing in self.standings.items():
            k, rate = self.best(name, self.k_max)
            nodes, tree_rate = self.best_tree(name, self.tree_max) if self.weighs_trees(name) else (0, float("-inf"))
            tree = nodes if tree_rate > rate else 0
            rate = max(rate, tree_rate)
            if standing.on and rate < plain:
                standing.on, standing.failures = False, 0
                standing.wait = probe_wait(self.loss(name, self.probe_k), 0)
            elif standing.on:
                standing.k, standing.tree = k, tree
            elif not standing.on and rate > plain * (1.0 + self.margin):  # hysteresis: back only when clearly worth it
                standing.on, standing.k, standing.tree, standing.failures = True, k, tree, 0
            elif not standing.on and name == probed:
                standing.failures += 1
                standing.wait = probe_wait(self.loss(name, self.probe_k), standing.failures)

    # --- estimates (seconds once measured; one-token forwards before) ------------------------------

    def draft_s(self, name: str, k: int) -> float:
        standing = self._standing(name)
        one = self.costs.one_token_s()
        if one is not None and standing.draft_s_per_token is not None:
            return k * standing.draft_s_per_token
        return k * standing.c * (one or 1.0)

    def round(self, name: str, k: int) -> tuple[float, float]:
        """Expected tokens and seconds of a round of at most K drafts from ``name``: K in full, or
        as far as its gate lets it go, by the gated rounds seen so far."""
        return self.rounds(name, k)[-1]

    def rate(self, name: str, k: int) -> float:
        """Expected tokens per second (per one-token forward before any measurement)."""
        if k <= 0:
            return self.plain_rate()
        tokens, seconds = self.round(name, k)
        return tokens / seconds

    def plain_rate(self) -> float:
        return 1.0 / (self.costs.verify_s(0) + self.costs.overhead_s())

    def predicted(self, k: int, name: str | None = None) -> float:
        """Predicted speed-up over plain decoding of K drafts a round from one drafter."""
        return self.rate(name or self.main, k) / self.plain_rate()

    def best(self, name: str, cap: int) -> tuple[int, float]:
        """The K ≥ 1 (up to cap) with the highest rate (the smaller K on a tie: less waste)."""
        best = (1, float("-inf"))
        for k, (tokens, seconds) in enumerate(self.rounds(name, min(max(cap, 1), MAX_K)), start=1):
            if tokens / seconds > best[1]:
                best = (k, tokens / seconds)
        return best

    def rounds(self, name: str, cap: int) -> list[tuple[float, float]]:
        """``round(name, k)`` for k = 1 .. cap from one read of the estimates (and, gated, one pass of
        gate.gated_rounds): the controller weighs every K of every drafter twice a round, so weighing
        each K afresh, with verify costs recomputed at every read, is a cost paid twice a round; one
        read gives the same figures to the bit (docs/notebook.md, "Figures that were in the code's
        docstrings")."""
        standing = self._standing(name)
        accepts = standing.acceptance.rates(cap)
        verify = [self.costs.verify_s(d) for d in range(cap + 1)]
        step, overhead = self.draft_s(name, 1), self.costs.overhead_s()
        if standing.gated and self.gating:
            passes = standing.passes.rates(cap)
            return gated_rounds(passes, accepts, verify, step, overhead)
        found, tokens, survive = [], 1.0, 1.0
        for k in range(1, cap + 1):
            survive *= accepts[k - 1]
            tokens += survive
            found.append((tokens, verify[k] + self.draft_s(name, k) + overhead))
        return found

    def weighs_trees(self, name: str) -> bool:
        return self.trees and name == self.main

    def tree_rates(self, name: str):
        """(depth, rank) → the estimated chance a tree node is kept given its parent was."""
        standing = self._standing(name)
        chain = standing.acceptance.rates(self.shape.depth)
        return lambda depth, rank: chain[depth - 1] if rank == 0 else standing.siblings.rate(depth, rank)

    def tree_draft_s(self, name: str, levels: int) -> float:
        """A tree draft of this many levels: measured per level, else a chain step's cost a little raised."""
        standing = self._standing(name)
        if standing.level_s is not None and self.costs.one_token_s() is not None:
            return levels * standing.level_s
        return TREE_LEVEL_COST * self.draft_s(name, levels)

    def best_tree(self, name: str, cap: int) -> tuple[int, float]:
        """The tree budget N (2 ≤ N ≤ cap, tree_max) with the highest expected tokens per second.

        Expected tokens of the best N-node tree under the estimates (tree.best_first: every prefix of
        the best-first order is the best tree of its size), over the verify time of N + 1 tokens, the
        draft time of its levels and a round's bookkeeping.
        """
        taken = best_first(self.tree_rates(name), min(cap, self.tree_max), self.shape.width, self.shape.depth)
        overhead, best = self.costs.overhead_s(), (0, float("-inf"))
        total, levels = 1.0, 0
        for nodes, (value, _, depth) in enumerate(taken, start=1):
            total, levels = total + value, max(levels, depth)
            if nodes < 2:
                continue  # a one-node tree is the chain of one
            rate = total / (self.costs.verify_s(nodes) + self.tree_draft_s(name, levels) + overhead)
            if rate > best[1]:
                best = (nodes, rate)
        return best

    def loss(self, name: str, k: int) -> float:
        """What a round of K drafts costs over what it yields, in plain rounds (0 when it pays)."""
        tokens, seconds = self.round(name, k)
        return max(0.0, seconds * self.plain_rate() - tokens)

    @property
    def alpha(self) -> float:
        return self._standing(self.main).acceptance.alpha

    @property
    def off(self) -> bool:
        return not self._standing(self.main).on

    @property
    def k(self) -> int:
        return self._standing(self.main).k

    def _standing(self, name: str, free: bool = False) -> Standing:
        """The estimates of drafter ``name``, made on first sight. ``free``: it was offered, a ready draft
        that costs nothing to find, whether or not the priors know its name."""
        if name not in self.standings:
            rates = self.prior.free_rates(name)
            if rates is not None and name != self.main:  # beside the main drafter: its own rates by position
                acceptance = Acceptance(rates[0], positions=rates)
            else:
                acceptance = Acceptance(self.prior.alpha)
            standing = Standing(acceptance, 0.0 if free or rates is not None else self.prior.c, 1, self.prior.k > 0,
                            siblings=Siblings(self.prior.siblings))
            self.standings[name] = standing
            k, rate = self.best(name, self.k_max)
            standing.k = self.prior.k if self.prior.k > 0 else k
            # A drafter beside the main one starts on only if its prior says it pays (a one-token
            # lookup match does not: it waits for a probe).
            if standing.on and name != self.main and rate < self.plain_rate():
                standing.on = False
            if not standing.on:
                standing.wait = probe_wait(self.loss(name, self.probe_k) if self.prior.k else 1.0, 0)
        return self.standings[name]

    # --- reporting -------------------------------------------------------------------------------

    def begin(self) -> None:
        """Start a prompt: reset its counters, and halve the acceptance evidence.

        Acceptance swings within an answer (copied code, then prose about it); a new prompt is a
        new context, so the last prompt's tail should not decide alone how the next one starts.
        Costs are properties of the machine and carry over as they are; so do on/off and the
        probe schedule (the scenario's character persists).
        """
        if self.rounds_seen:
            for standing in self.standings.values():
                standing.acceptance.forget()
                standing.siblings.forget()
        self.running = True  # planning an answer's rounds (``end``: no longer)
        self.rounds_off, self.probes, self.declined = 0, 0, 0
        self.k_used: Counter[int] = Counter()
        self.trees_used: Counter[int] = Counter()  # tree rounds by nodes drafted
        self.drafts: defaultdict[str, RoundCounts] = defaultdict(RoundCounts)
        self.k_start = 0 if self.off else self.k

    def end(self) -> None:
        self.running = False

    def gains(self, plan: Plan) -> tuple[list[float], float] | None:
        """1, 1 + a₁, 1 + a₁ + a₁a₂, …: expected tokens by the chain's drafts, on the planned drafter's
        acceptance by position; and its seconds a drafted token (an offer's: none)."""
        if plan.take is Take.TREE:
            return None
        if plan.take is Take.NOTHING or plan.k == 0:
            return [1.0], 0.0
        name = plan.source or self.main
        found, survive = [1.0], 1.0
        for rate in self._standing(name).acceptance.rates(plan.k):
            survive *= rate
            found.append(found[-1] + survive)
        return found, 0.0 if plan.take is Take.OFFER else self.draft_s(name, 1)

    def report(self) -> dict:
        """Per-prompt figures for the JSON statistics."""
        return {
            "k_start": self.k_start,
            "k_end": 0 if self.off else self.k,
            "k_used": {str(k): n for k, n in sorted(self.k_used.items())},
            "drafted_by": {name: counts.rounds for name, counts in sorted(self.drafts.items())},
            "drafters": {name: counts.drafter_figures() for name, counts in sorted(self.drafts.items())},
            "rounds_off": self.rounds_off,
            "probes": self.probes,
            "gated_off": self.declined,  # rounds where the gate declined the learned drafter's first guess
            "alpha_estimate": round(self.alpha, 4),
            **({"tree_end": 0 if self.off else self._standing(self.main).tree,
                "tree_rounds": sum(self.trees_used.values()),
                "tree_nodes": {str(n): rounds for n, rounds in sorted(self.trees_used.items())}} if self.trees else {}),
        }

    def describe(self) -> str:
        """One line for the live view."""
        parts = []
        for name, standing in sorted(self.standings.items()):
            alpha = standing.acceptance.alpha
            what = f"tree {standing.tree}" if standing.tree else f"K {standing.k}"
            parts.append(f"{name} {what} (α≈{alpha:.2f})" if standing.on
                         else f"{name} off (α≈{alpha:.2f}, probe in {max(standing.wait, 0)})")
        return "auto: " + ", ".join(parts)
