"""The adaptive K controller, driven by synthetic round events: no models, no clocks."""

import random
from dataclasses import replace

import pytest

from specdec_cli.decoding.control.adaptive import AdaptiveK
from specdec_cli.decoding.control.controller import AdaptiveController
from specdec_cli.decoding.engine import RoundEvent
from specdec_cli.decoding.schedule import Plan, Take
from specdec_cli.decoding.control.estimates import Acceptance, probe_wait
from specdec_cli.decoding.control.priors import Prior
from specdec_cli.decoding.control.speedup import (
    OFF,
    SPECULATE,
    break_even_alpha,
    choose,
    expected_tokens,
    fill_verify_costs,
    predicted_speedup,
)
from specdec_cli.pairs.profile import PairProfile, ScenarioProfile

ONE = 0.05  # seconds of a one-token target forward in these synthetic rounds
COSTS = {k: 1.0 + 0.08 * k for k in range(1, 9)}


def event(k: int, accepted: int, c: float = 0.01, source: str = "model") -> RoundEvent:
    drafted = list(range(10, 10 + k))
    emitted = drafted[:accepted] + [99]
    return RoundEvent(k=k, drafted=drafted, accepted=accepted, token=99, emitted=emitted,
                      draft_s=k * c * ONE, verify_s=ONE * COSTS.get(k, 1.0), finished=False, source=source if k else "")


def survive(k: int, alpha: float, rng: random.Random) -> int:
    accepted = 0
    while accepted < k and rng.random() < alpha:
        accepted += 1
    return accepted


def main_k(schedule: AdaptiveK) -> int:
    """The K a schedule plans for its main drafter when prompt lookup offers nothing."""
    return schedule.plan({}, schedule.main, schedule.k_max).k


def drive(schedule: AdaptiveK, alpha: float, rounds: int, rng: random.Random) -> list[int]:
    """Run rounds where each draft token survives with probability alpha; the K chosen per round."""
    chosen = []
    for _ in range(rounds):
        k = main_k(schedule)
        schedule.observe(event(k, survive(k, alpha, rng)))
        chosen.append(k)
    return chosen


def test_k_moves_up_to_the_largest_when_every_draft_is_accepted():
    schedule = AdaptiveK(Prior(2, 0.5, 0.01, COSTS))
    chosen = drive(schedule, 1.0, 60, random.Random(0))
    assert chosen[0] == 2  # starts from the profile's K
    assert chosen[-10:] == [8] * 10
    assert schedule.rounds_off == 0


def test_speculation_switches_off_when_acceptance_collapses_and_comes_back_after_recovery():
    rng = random.Random(1)
    schedule = AdaptiveK(Prior(6, 0.8, 0.01, COSTS))
    high = drive(schedule, 0.9, 40, rng)
    assert min(high[-10:]) >= 4 and not schedule.off

    collapsed = drive(schedule, 0.0, 400, rng)
    assert schedule.off
    tail = collapsed[-300:]
    assert tail.count(0) >= 290  # plain decoding, with a rare short probe
    assert set(tail) == {0, schedule.probe_k}
    assert schedule.rounds_off >= 330

    recovered = drive(schedule, 0.95, 600, rng)
    assert not schedule.off
    assert min(recovered[-20:]) >= 4


def test_probes_back_off_while_they_keep_failing():
    """Each failed probe doubles the wait; a probe that loses more waits longer to begin with."""
    schedule = AdaptiveK(Prior(0, 0.05, 0.01, COSTS))
    assert schedule.off
    chosen = drive(schedule, 0.0, 3000, random.Random(2))
    probes = [i for i, k in enumerate(chosen) if k]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert len(probes) >= 4 and all(later >= 1.8 * earlier for earlier, later in zip(gaps, gaps[1:]) if later < 1000)
    report = schedule.report()
    assert report["k_start"] == 0 and report["rounds_off"] + report["probes"] == 3000
    assert report["probes"] == len(probes) < 12  # a fixed interval of 16 would have probed 187 times
    assert probe_wait(0.5, 0) == 50 and probe_wait(0.5, 2) == 200 and probe_wait(0.0, 0) == 4
    assert probe_wait(2.0, 9) == 1024  # capped
    schedule.begin()
    assert schedule.report()["rounds_off"] == 0


def test_a_new_prompt_halves_the_acceptance_evidence_and_keeps_the_scenarios_state():
    schedule = AdaptiveK(Prior(6, 0.8, 0.01, COSTS))
    drive(schedule, 0.0, 30, random.Random(3))  # this prompt's tail: nothing accepted
    assert schedule.off and schedule.alpha < 0.2
    before = schedule.standings["model"].acceptance.trials[0]
    schedule.begin()
    assert schedule.standings["model"].acceptance.trials[0] == pytest.approx(before / 2)
    assert schedule.off  # the probe schedule carries over: the scenario's character persists


def test_slow_drafting_turns_speculation_off_even_at_high_acceptance():
    schedule = AdaptiveK(Prior(3, 0.6, 0.01, COSTS))
    for _ in range(40):
        k = main_k(schedule)
        schedule.observe(event(k, k // 2, c=2.0))  # each draft token costs two target forwards
    assert schedule.off


def test_each_round_picks_lookups_match_the_learned_drafter_or_nothing_on_separate_estimates():
    """Lookup pays (its drafts survive, cost nothing), the head does not (α 0.2, a fifth of a forward
    a token): lookup's match whenever there is one, K capped by its length; nothing otherwise."""
    rng = random.Random(5)
    schedule = AdaptiveK(Prior(3, 0.7, 0.2, COSTS), main="head")
    picks = []
    for i in range(300):
        offer = [0, 5, 2, 0, 7][i % 5]
        plan = schedule.plan({"lookup": offer} if offer else {}, "head", 8)
        k, source = plan.k, plan.source or None
        alpha = 0.95 if source == "lookup" else 0.2
        schedule.observe(event(k, survive(k, alpha, rng), c=0.0 if source == "lookup" else 0.2, source=source or ""))
        picks.append((offer, k, source))
    late = picks[-100:]
    assert all(source == "lookup" and 1 <= k <= offer for offer, k, source in late if offer)
    assert sum(source == "head" for _, _, source in late) <= 2  # a rare probe at most
    assert schedule.standings["lookup"].on and not schedule.standings["head"].on
    assert schedule.standings["lookup"].acceptance.alpha > 0.8 > 0.4 > schedule.standings["head"].acceptance.alpha
    report = schedule.report()
    assert report["drafted_by"]["lookup"] >= 100
    lookup = report["drafters"]["lookup"]  # each drafter's rounds, drafts and kept ones, as they happened
    assert lookup["rounds"] == report["drafted_by"]["lookup"]
    assert lookup["alpha"] > 0.8 and lookup["drafted"] >= lookup["accepted"] >= lookup["rounds"]


def test_the_learned_drafter_wins_where_lookups_matches_are_poor():
    rng = random.Random(6)
    schedule = AdaptiveK(Prior(3, 0.7, 0.05, COSTS), main="head")
    picks = []
    for _ in range(200):
        plan = schedule.plan({"lookup-1": 4}, "head", 8)
        k, source = plan.k, plan.source or None
        alpha = 0.1 if source == "lookup-1" else 0.85
        schedule.observe(event(k, survive(k, alpha, rng), c=0.0 if source == "lookup-1" else 0.05, source=source or ""))
        picks.append(source)
    assert set(picks[-100:]) == {"head"} and schedule.standings["head"].on


def test_acceptance_by_position_shrinks_unseen_positions_to_the_one_before():
    acceptance = Acceptance(prior=0.5, weight=1.0)
    assert acceptance.rates(3) == [0.5, 0.5, 0.5]
    assert acceptance.expected(2) == pytest.approx(1 + 0.5 + 0.25)
    for _ in range(50):
        acceptance.observe(accepted=1, drafted=3)  # position 0 always survives, position 1 never
    first, second, third = acceptance.rates(3)
    assert first > 0.9 and second < 0.1 and third == pytest.approx(second)  # never judged: borrows
    assert acceptance.expected(3) == pytest.approx(1 + first + first * second + first * second * third)


def test_a_prior_by_position_replaces_borrowing_until_rounds_say_otherwise():
    acceptance = Acceptance(prior=0.2, positions=(0.2, 0.6))
    assert acceptance.rates(3) == pytest.approx([0.2, 0.6, 0.6])  # past the known positions: borrows
    for _ in range(50):
        acceptance.observe(accepted=2, drafted=2)
    assert acceptance.rates(2)[0] > 0.9 and acceptance.rates(2)[1] > 0.9


def test_a_one_token_lookup_match_starts_off_and_a_longer_one_on_beside_a_learned_drafter():
    """Replayed on the target's answers a one-token match's first guess held 19 % of the time: below
    break-even, so it waits for a probe instead of costing the first rounds of every prompt."""
    schedule = AdaptiveK(Prior(3, 0.5, 0.2, {1: 1.22, 2: 1.34, 3: 1.57, 4: 2.17}), main="head")  # a CPU's
    assert schedule.plan({"lookup-1": 3}, "head", 8) == Plan(3, Take.LEARNED, "head")
    assert not schedule.standings["lookup-1"].on and schedule.standings["lookup-1"].wait >= 4
    assert schedule.standings["lookup-1"].acceptance.rates(2) == pytest.approx(Prior.free_rates("lookup-1")[:2])
    schedule.plan({"lookup": 3}, "head", 8)
    assert schedule.standings["lookup"].on


def test_an_offered_drafter_the_priors_do_not_name_is_free_not_priced_as_a_model():
    """What is offered is a free drafter's ready draft, whatever its name: a new free kind without a
    line in the priors costs nothing to draft, as lookup does, not the model's share of a forward."""
    schedule = AdaptiveK(Prior(3, 0.5, 0.3, COSTS), main="head")
    schedule.plan({"brand-new": 4, "lookup": 4}, "head", 8)
    assert schedule.standings["brand-new"].c == 0.0 == schedule.standings["lookup"].c
    assert schedule.standings["head"].c == pytest.approx(0.3)


def test_controller_keeps_schedules_per_scenario_one_an_answer_and_reseeds_from_a_new_profile():
    def profile(code_k):
        section = ScenarioProfile(k=code_k, verdict=SPECULATE, best_k=code_k, speedup=1.5, alpha=0.8, c=0.0,
                                  verify_cost=COSTS)
        off = ScenarioProfile(k=0, verdict=OFF, best_k=3, speedup=0.9, alpha=0.05, c=0.0, verify_cost=COSTS)
        return PairProfile("p", "now", "t", "ngram", {"code": section, "creative": off}, overall=section)

    controller = AdaptiveController(lambda scenario: 4, model_drafter=False, profile=profile(3))
    assert main_k(controller.schedule("code")) == 3
    assert controller.schedule("creative").off
    assert main_k(controller.schedule("elsewhere")) == 3  # unknown scenario: the overall section
    first = controller.schedule("code")
    first.end()  # its answer is over: the next prompt of the scenario gets it, with what it learnt
    assert controller.schedule("code") is first
    beside = controller.schedule("code")  # a batch: an answer beside one in progress gets one of its own
    assert beside is not first and main_k(beside) == 3
    controller.reseed(profile(6))
    assert main_k(controller.schedule("code")) == 6
    assert main_k(AdaptiveController(lambda s: 5, model_drafter=True).schedule(None)) == 5  # no profile


def test_the_controller_keeps_the_pairs_drafter_under_the_name_its_drafts_carry():
    from specdec_cli.decoding.control.controller import main_name
    from specdec_cli.decoding.drafters.lookup import lookup_source
    from specdec_cli.decoding.drafters.recycle import recycle_source
    from specdec_cli.decoding.drafters.store import store_source
    from specdec_cli.decoding.drafters.suffix import suffix_source

    # a free drafter's strongest match: prompt lookup's (kind ngram) drafts say "lookup"
    assert main_name("ngram") == lookup_source(3)
    assert (main_name("recycle"), main_name("suffix"), main_name("store")) == (recycle_source(3), suffix_source(4),
                                                                              store_source(4))
    assert (main_name("model"), main_name("head")) == ("model", "head")  # a learned drafter's: its name


# --- the pure speed-up math -----------------------------------------------------------------------


def test_expected_tokens_and_predicted_speedup():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert predicted_speedup(0.5, 2, 0.1, 1.2) == pytest.approx(1.75 / 1.4)
    assert predicted_speedup(0.3, 0, 5.0, 9.0) == 1.0


def test_break_even_alpha_solves_the_formula():
    alpha = break_even_alpha(3, 0.05, 1.3)
    assert predicted_speedup(alpha, 3, 0.05, 1.3) == pytest.approx(1.0, abs=1e-4)
    assert 0.2 < alpha < 0.4
    assert break_even_alpha(2, 0.0, 0.9) == 0.0  # verifying more is cheaper than one token: always pays
    assert break_even_alpha(4, 1.0, 2.0) is None  # 5 tokens at best for a cost of 6: never pays
    assert break_even_alpha(0, 0.0, 1.0) is None


def test_choose_picks_the_best_measured_k_and_says_off_below_one():
    speculate = choose({0: 1.0, 1: 1.2, 2: 1.5, 3: 1.4})
    assert (speculate.best_k, speculate.verdict, speculate.k) == (2, SPECULATE, 2)
    off = choose({0: 1.0, 1: 0.93, 2: 0.97, 3: 0.81})
    assert (off.best_k, off.verdict, off.k) == (2, OFF, 0)
    assert choose({0: 1.0, 3: 2.0, 5: 2.0}).best_k == 5


def test_fill_verify_costs_interpolates_and_extrapolates_unseen_blocks():
    filled = fill_verify_costs({1: 1.1, 3: 1.5}, [0, 1, 2, 3, 4, 5])
    assert filled[0] == 1.0 and filled[2] == pytest.approx(1.3)
    assert filled[4] == pytest.approx(1.7) and filled[5] == pytest.approx(1.9)
    assert fill_verify_costs({}, [0, 2]) == {0: 1.0, 2: 1.0}


def test_a_heads_catch_up_after_sitting_out_is_not_charged_per_drafted_token():
    schedule = AdaptiveK(Prior(3, 0.7, 0.2, COSTS), main="head")
    first = event(3, 2, c=0.2, source="head")
    first = replace(first, draft_s=first.draft_s + 0.5, catchup_s=0.5)  # ten target forwards of catching up
    schedule.observe(first)
    assert schedule.standings["head"].draft_s_per_token == pytest.approx(0.2 * ONE)


def rounds_until_off(controller: AdaptiveController) -> int:
    """Rounds a weak drafter (every draft refused) keeps drafting before the controller stops it."""
    schedule = controller.schedule(None)
    for rounds in range(1, 50):
        k = main_k(schedule)
        if k == 0:
            return rounds - 1
        schedule.observe(event(k, 0, c=0.06))
    return 50


def test_a_drafters_recorded_acceptance_seeds_the_controller_without_a_profile():
    blocks = {k: 1.0 + 0.15 * k for k in range(1, 9)}  # a CPU's verify costs, as the block-cost cache gives them
    guessed = AdaptiveController(lambda scenario: 3, True, block_cost=blocks)
    recorded = AdaptiveController(lambda scenario: 3, True, block_cost=blocks, alpha=0.29)
    assert guessed.schedule(None).alpha == pytest.approx(0.7) and recorded.schedule(None).alpha == pytest.approx(0.29)
    assert rounds_until_off(recorded) == 1  # the pair's K once, then off: the first refusal is evidence enough
    assert rounds_until_off(guessed) >= 3  # the optimistic guess pays for its first rounds


def test_the_runtime_reads_the_drafters_recorded_acceptance_from_its_metadata(tmp_path):
    from specdec_cli.decoding.loaded_pair import LoadedPair
    from specdec_cli.pairs.meta import write_meta
    from specdec_cli.pairs.registry import DrafterSpec, ModelSpec, PairSpec
    from specdec_cli.pairs.sources import ModelSource

    pair = PairSpec("p", ModelSpec(ModelSource.parse("package:x/y.gguf")), DrafterSpec(head=tmp_path))
    runtime = LoadedPair(pair, target=None, drafter=None, draft=None)
    assert runtime.expected_alpha() is None
    for value, read in ((0.31, 0.31), ("high", None), (1.5, None)):
        write_meta(tmp_path, {"kind": "head", "expected_alpha": value})
        assert runtime.expected_alpha() == read


def test_finding_the_free_drafters_drafts_is_charged_to_every_round_not_to_the_drafter_that_drafted():
    schedule = AdaptiveK(Prior(3, 0.5, 0.2), main="head")
    round_ = RoundEvent(k=2, drafted=[5, 6], accepted=1, token=7, emitted=[5, 7], draft_s=0.005, verify_s=0.01,
                        finished=False, source="head", other_s=0.001, offer_s=0.003)
    schedule.observe(round_)
    assert schedule.standings["head"].draft_s_per_token == pytest.approx(0.001)  # (5 ms − 3 ms) / 2 drafts
    assert schedule.costs.other_s == pytest.approx(0.004)


def test_a_shared_forward_that_drafted_nothing_leaves_the_standings_as_they_were():
    """Verify costs rise with the context here (context_cost), past where drafting pays: a round of
    the answer's own forward re-weighs and turns speculation off; one in a shared forward that
    drafted nothing tells nothing new, and leaves it on until a round that drafts."""
    costs = {k: 0.01 for k in range(1, 9)}  # seconds each cached token adds to a block of K drafts
    for batch, off in ((4, False), (1, True)):
        schedule = AdaptiveK(Prior(2, 0.6, 0.01, COSTS), context_cost={0: 0.0, **costs})
        drive(schedule, 0.6, 20, random.Random(2))
        assert not schedule.off
        schedule.context(50)
        schedule.observe(replace(event(0, 0), batch=batch, cached=50))
        assert schedule.off is off
