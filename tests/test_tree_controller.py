"""The adaptive controller weighing trees: the expected-length math, what a tree round teaches, the
choice between off, chains and trees, and that rounds it plans as trees stay lossless."""

import random

import pytest
import torch
from exactness import PROMPT as SMALL_PROMPT
from exactness import assert_lossless, small_models

from specdec_cli.decoding.acceptance import SamplingParams
from specdec_cli.decoding.control.adaptive import AdaptiveK
from specdec_cli.decoding.blocks import relative_costs
from specdec_cli.decoding.control.controller import AdaptiveController, sibling_prior
from specdec_cli.decoding.drafters.lookup import LookupFirst
from specdec_cli.decoding.engine import KSchedule, RoundEvent, SpeculativeEngine
from specdec_cli.decoding.control.estimates import Acceptance, Siblings
from specdec_cli.decoding.drafters.head import HeadDrafter
from specdec_cli.decoding.head_network import DraftHead, head_config
from specdec_cli.decoding.control.priors import Prior
from specdec_cli.decoding.schedule import Plan, Take
from specdec_cli.decoding.tree import best_first, expected_accepted, expected_tree, judgements, shape_of
from specdec_cli.pairs.profile import PairProfile, ScenarioProfile

RATES = {(1, 0): 0.5, (1, 1): 0.3, (2, 0): 0.4, (2, 1): 0.2, (3, 0): 0.4}


def rate(depth, rank):
    return RATES.get((depth, rank), 0.0)


def test_expected_accepted_is_one_plus_the_path_probabilities():
    # root → a (rank 0), b (rank 1); a → c (rank 0), d (rank 1); c → e
    parents = [-1, 0, 0, 1, 1, 3]
    assert shape_of(parents) == ([0, 1, 1, 2, 2, 3], [0, 0, 1, 0, 1, 0])
    assert shape_of([-1, 0, 0, 0]) == ([0, 1, 1, 1], [0, 0, 1, 2])  # a third sibling ranks 2
    expected = 1 + 0.5 + 0.3 + 0.5 * 0.4 + 0.5 * 0.2 + 0.5 * 0.4 * 0.4
    assert expected_accepted(parents, rate) == pytest.approx(expected, abs=1e-12)
    chain = [-1, 0, 1, 2]
    assert expected_accepted(chain, rate) == pytest.approx(1 + 0.5 + 0.2 + 0.08, abs=1e-12)


def test_the_best_tree_takes_nodes_by_path_probability_and_each_prefix_is_best():
    assert expected_tree(rate, 1, 2, 3) == (pytest.approx(1.5), [-1, 0])
    assert expected_tree(rate, 2, 2, 3) == (pytest.approx(1.8), [-1, 0, 0])  # the runner-up 0.3 beats 0.5·0.4
    assert expected_tree(rate, 3, 2, 3) == (pytest.approx(2.0), [-1, 0, 0, 1])
    assert expected_tree(rate, 4, 2, 3) == (pytest.approx(2.12), [-1, 0, 0, 1, 2])  # b's child 0.3·0.4 beats a's runner-up 0.1
    value, parents = expected_tree(rate, 6, 2, 3)
    assert value == pytest.approx(expected_accepted(parents, rate))
    # by brute force over every 3-node tree of width 2, depth 3: none beats the best-first one
    shapes = [[-1, 0, 1, 2], [-1, 0, 0, 1], [-1, 0, 0, 2], [-1, 0, 1, 1], [-1, 0, 0, 1]]
    assert max(expected_accepted(s, rate) for s in shapes) == pytest.approx(expected_tree(rate, 3, 2, 3)[0])
    # width 1 is the chain: Acceptance.expected's formula
    acceptance = Acceptance(0.6, weight=1.0)
    rates = acceptance.rates(5)
    assert expected_tree(lambda d, r: rates[d - 1] if r == 0 else 0.9, 5, 1, 5)[0] == pytest.approx(acceptance.expected(5))
    assert [depth for _, _, depth in best_first(rate, 6, 2, 3)] == [1, 1, 2, 2, 2, 3]


def test_a_tree_round_judges_every_child_of_each_node_its_path_reached():
    parents = [-1, 0, 0, 1, 1, 2]  # root → 1, 2; 1 → 3, 4; 2 → 5
    assert judgements(parents, [2], True) == [(1, 0, False), (1, 1, True), (2, 0, False)]
    assert judgements(parents, [1, 4], True) == [(1, 0, True), (1, 1, False), (2, 0, False), (2, 1, True)]
    assert judgements(parents, [2, 5], False) == [(1, 0, False), (1, 1, True), (2, 0, True)]  # cut: 5's children unjudged
    assert judgements(parents, [], True) == [(1, 0, False), (1, 1, False)]


def test_sibling_acceptance_starts_from_its_prior_and_unseen_depths_borrow_the_one_above():
    siblings = Siblings((0.2, 0.1), weight=1.0, memory=1.0)
    assert siblings.rate(1, 1) == pytest.approx(0.2) and siblings.rate(3, 2) == pytest.approx(0.1)
    assert siblings.rate(1, 5) == 0.0
    for kept in (True, True, True, False):
        siblings.judge(1, 1, kept)
    assert siblings.rate(1, 1) == pytest.approx((3 + 0.2) / 5)
    assert siblings.rate(2, 1) == pytest.approx(siblings.rate(1, 1))  # depth 2 never judged
    siblings.forget()
    assert siblings.trials[(1, 1)] == pytest.approx(2.0)


def test_block_costs_become_verify_costs_by_k_with_padding():
    costs = {1: 0.010, 2: 0.016, 3: 0.020, 4: 0.014}
    assert relative_costs(costs, {1: 1, 2: 4, 3: 4, 4: 4}) == pytest.approx({1: 1.4, 2: 1.4, 3: 1.4})
    assert relative_costs(costs, {}) == pytest.approx({1: 1.6, 2: 2.0, 3: 1.4})
    assert Prior(2, 0.5, 0.1, {1: 1.3}, {1: 1.5, 2: 1.6}).cost(1) == 1.3  # the profile's measured figure wins
    assert Prior(2, 0.5, 0.1, {1: 1.3}, {1: 1.5, 2: 1.6}).cost(2) == 1.6
    assert Prior(2, 0.5, 0.1, {}, {1: 1.5, 2: 1.6}).cost(4) == pytest.approx(1.6 + 0.24)


ONE = 0.05


def plain_event():
    return RoundEvent(k=0, drafted=[], accepted=0, token=99, emitted=[99], draft_s=0.0, verify_s=ONE, finished=False)


def simulate(schedule: AdaptiveK, true_rate, cost, rounds: int, seed: int = 0) -> list[str]:
    """Rounds against a world where a node of (depth, rank) is the target's pick with ``true_rate``:
    the controller plans, the world answers with the round it would have seen. Returns what it chose."""
    rng, chosen = random.Random(seed), []
    for _ in range(rounds):
        plan = schedule.plan({}, "head", 8)
        k = plan.k
        if not k:
            schedule.observe(plain_event())
            chosen.append("off")
            continue
        tree = plan.take is Take.TREE
        parents = expected_tree(true_rate, k, 4, 5)[1] if tree else list(range(-1, k))
        depths, ranks = shape_of(parents)
        path, node = [], 0
        while True:
            children = [c for c in range(len(parents)) if parents[c] == node]
            pick, roll = None, rng.random()
            for c in children:  # disjoint events: the target picks at most one child
                roll -= true_rate(depths[c], ranks[c])
                if roll < 0:
                    pick = c
                    break
            if pick is None:
                break
            path.append(pick)
            node = pick
        emitted = [100 + i for i in range(len(path) + 1)]
        levels = max(depths)
        schedule.observe(RoundEvent(
            k=k, drafted=list(range(10, 10 + k)), accepted=len(path), token=99, emitted=emitted,
            draft_s=levels * 0.1 * ONE, verify_s=ONE * cost(k), finished=False, source="head",
            parents=tuple(parents[1:]) if tree else None, path=path if tree else None))
        chosen.append(f"tree:{k}" if tree else f"chain:{k}")
    return chosen


def world(rank0, rank1):
    return lambda depth, rank: rank0 if rank == 0 else (rank1 if rank == 1 else rank1 / 4)


def test_the_choice_flips_from_chain_to_tree_when_runners_up_are_kept_and_verify_is_flat():
    flat = lambda k: 1.0 + 0.02 * k  # noqa: E731
    steep = lambda k: 1.0 + 0.5 * k  # noqa: E731
    prior = Prior(2, 0.5, 0.1, {k: flat(k) for k in range(1, 13)})
    trees = simulate(AdaptiveK(prior, main="head", trees=True), world(0.45, 0.35), flat, 150)
    assert sum(c.startswith("tree") for c in trees[-50:]) >= 45
    assert max(int(c.split(":")[1]) for c in trees[-50:] if c.startswith("tree")) >= 4
    # the same world, but runners-up are never kept: chains
    chains = simulate(AdaptiveK(prior, main="head", trees=True), world(0.45, 0.0), flat, 150)
    assert sum(c.startswith("chain") for c in chains[-50:]) >= 45
    # runners-up kept, but every verified token costs half a forward: no wide trees
    costly = Prior(2, 0.5, 0.1, {k: steep(k) for k in range(1, 13)})
    narrow = simulate(AdaptiveK(costly, main="head", trees=True), world(0.45, 0.35), steep, 150)
    assert all(c == "off" or int(c.split(":")[1]) <= 2 for c in narrow[-50:])
    # trees not weighed: the controller never plans one
    without = simulate(AdaptiveK(prior, main="head"), world(0.45, 0.35), flat, 60)
    assert not any(c.startswith("tree") for c in without)


def test_tree_rounds_feed_rank_zero_into_the_chain_estimates_and_report_themselves():
    schedule = AdaptiveK(Prior(2, 0.5, 0.1, {}), main="head", trees=True)
    before = schedule._standing("head").acceptance.rates(1)[0]
    schedule.observe(RoundEvent(k=3, drafted=[5, 6, 7], accepted=1, token=99, emitted=[6, 99], draft_s=0.01,
                                verify_s=ONE, finished=False, source="head", parents=(0, 0, 2), path=[2]))
    standing = schedule._standing("head")
    assert standing.acceptance.rates(1)[0] < before  # the rank-0 child at depth 1 lost
    assert standing.siblings.trials[(1, 1)] == 1.0 and standing.siblings.hits[(1, 1)] == 1.0
    assert standing.level_s == pytest.approx(0.01 / 2)  # two levels
    assert schedule.report()["tree_rounds"] == 1 and schedule.report()["tree_nodes"] == {"3": 1}
    assert schedule.report()["k_used"] == {}


def test_the_profiles_tree_findings_seed_the_sibling_prior():
    section = ScenarioProfile(2, "speculate", 2, 1.1, 0.4, 0.1, {})
    profile = PairProfile("p", "now", "t", "d", {"default": section}, section,
                          settings={"tree": {"budgets": [4, 8], "scenarios": {"default": {"best": 8, "siblings": [0.3, 0.1]}}}})
    assert sibling_prior(profile, None) == (0.3, 0.1)
    assert sibling_prior(profile, "code") is None
    controller = AdaptiveController(lambda s: 2, True, profile, main="head", trees=True)
    assert controller.schedule(None).prior.siblings == (0.3, 0.1)
    assert controller.schedule(None).trees


class Planned(KSchedule):
    """A schedule that plans from a script: none, offer, learned (a chain of 3) or tree (6 nodes)."""

    reads_offer = trees = True

    def __init__(self, script):
        self.script, self.round = list(script), 0

    def plan(self, offers, learned, room):
        offer_source, offer = next(iter(offers.items()), (None, 0))  # the first free drafter's
        what = self.script[self.round % len(self.script)]
        self.round += 1
        if what == "offer" and offer:
            return Plan(min(3, offer), Take.OFFER, offer_source)
        if what == "learned":
            return Plan(min(3, room), Take.LEARNED, learned)
        if what == "tree":
            return Plan(min(6, room), Take.TREE, learned)
        return Plan.nothing()

    def choose(self):
        raise AssertionError("plan is called")

    def observe(self, event):
        pass


PROMPT = [0, 5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6]


def test_any_mix_of_trees_chains_lookup_and_plain_rounds_is_token_identical_to_plain(target):
    plain = [t for e in SpeculativeEngine(target, None, {1}).generate(PROMPT, k=0, max_new_tokens=30) for t in e.emitted]
    rng = random.Random(0)
    torch.manual_seed(3)
    head = HeadDrafter(DraftHead(head_config(target)), target)
    for _ in range(3):
        script = [rng.choice(["none", "offer", "learned", "tree", "tree"]) for _ in range(40)]
        events = list(SpeculativeEngine(target, LookupFirst(head), {1}).generate(PROMPT, k=Planned(script), max_new_tokens=30))
        assert [t for e in events for t in e.emitted] == plain
        assert any(e.parents is not None for e in events) and any(e.parents is None and e.drafted for e in events)
        assert all(e.source == "head" for e in events if e.parents is not None)


@pytest.mark.slow
def test_the_controllers_tree_rounds_keep_the_targets_exact_distribution():
    target, _ = small_models()
    torch.manual_seed(0)
    head = HeadDrafter(DraftHead(head_config(target)), target)
    rng = random.Random(2)

    class Coin(Planned):
        def plan(self, offers, learned, room):
            return Plan(min(2, room), Take.LEARNED, learned) if rng.random() < 0.3 else Plan(6, Take.TREE, learned)

    sampling, prompt = SamplingParams(1.0), SMALL_PROMPT
    assert_lossless(target, LookupFirst(head), sampling, k=Coin([]), prompt=prompt)


def test_a_lossy_rule_is_refused_when_the_schedule_may_plan_trees(target):
    from specdec_cli.decoding.acceptance import AcceptRule
    from specdec_cli.errors import UserError

    torch.manual_seed(3)
    engine = SpeculativeEngine(target, LookupFirst(HeadDrafter(DraftHead(head_config(target)), target)), {1})
    with pytest.raises(UserError, match="trees are verified exactly"):
        next(iter(engine.generate(PROMPT, k=Planned(["tree"]), max_new_tokens=5, rule=AcceptRule("top", (3.0,)))))
