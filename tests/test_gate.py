"""The confidence gate (decoding/control/gate.py): its arithmetic, drafters stopping where it says, and
output unchanged by it, greedy token for token and sampled in distribution."""

import pytest
import torch
from exactness import PROMPT as SMALL_PROMPT
from exactness import IDENTITY_RUNS, VOCAB, assert_lossless, small_models

from specdec_cli.decoding.acceptance import SamplingParams
from specdec_cli.decoding.control.adaptive import AdaptiveK
from specdec_cli.decoding.drafters.base import autoregress
from specdec_cli.decoding.drafters.lookup import LookupFirst
from specdec_cli.decoding.drafters.model import ModelDrafter
from specdec_cli.decoding.engine import KSchedule, RoundEvent, SpeculativeEngine
from specdec_cli.decoding.control.estimates import Acceptance, Calibration
from specdec_cli.decoding.control.gate import DraftGate, gated_rounds
from specdec_cli.decoding.control.priors import Prior
from specdec_cli.decoding.schedule import Plan, Take

COSTS = (1.0, 1.16, 1.31, 1.5)  # verify seconds of 0..3 drafts: the int4 target's block costs


def test_a_guess_is_drafted_when_its_chance_pays_for_its_verify_row_and_the_next_step():
    gate = DraftGate(COSTS, step_s=0.06)
    # First guess: T = 1 + 0.06, E = 1, Δ = 0.16 + 0.06; worth iff c · 1.06 > 0.22, c > 0.2075.
    assert not gate.worth([0.20]) and gate.worth([0.21])
    # Second, after a first at 0.5: T = 1.16 + 0.12, E = 1.5, Δ = 0.15 + 0.06; worth iff 0.5 c · 1.28 > 0.315.
    assert not gate.worth([0.5, 0.49]) and gate.worth([0.5, 0.50])
    # The last position before the cap adds no further step: Δ = 0.19, worth iff c · 1.49 > 0.57 (0.75 with a step).
    assert gate.worth([1.0, 1.0, 0.45]) and not gate.worth([1.0, 1.0, 0.38])
    assert not gate.worth([1.0, 1.0, 1.0, 1.0])  # past the round's K: never


def test_calibration_scales_the_drafters_confidence_into_the_targets_acceptance():
    assert DraftGate(COSTS, 0.06, calibration=0.5).worth([0.40]) is False
    assert DraftGate(COSTS, 0.06, calibration=1.0).worth([0.40]) is True
    calibration = Calibration(weight=0.0, memory=1.0)
    calibration.observe([0.8, 0.8, 0.8], accepted=1)  # kept, turned down, never judged
    assert calibration.ratio == pytest.approx(1 / 1.6)
    assert Calibration().ratio == 1.0  # no evidence: the drafter is taken at its word


def test_a_gated_round_that_always_passes_is_a_fixed_k_round():
    accepts = [0.6, 0.5, 0.4]
    tokens, seconds = gated_rounds([1.0] * 3, accepts, COSTS, step_s=0.1, other_s=0.02)[-1]
    assert tokens == pytest.approx(Acceptance(0.0).expected(0) + 0.6 + 0.3 + 0.12)  # 1 + Σ Π a
    assert seconds == pytest.approx(1.5 + 3 * 0.1 + 0.02)


def test_a_gated_round_weighs_each_stopping_point_by_its_chance():
    tokens, seconds = gated_rounds([0.5, 0.5], [0.8, 0.5], COSTS[:3], step_s=0.1)[-1]
    # stop at 0 (p 0.5): 1.0 + 1 step; at 1 (0.25): 1.16 + 2 steps; at 2 (0.25): 1.31 + 2 steps.
    assert seconds == pytest.approx(0.5 * 1.1 + 0.25 * 1.36 + 0.25 * 1.51)
    assert tokens == pytest.approx(1 + 0.5 * 0.8 + 0.25 * 0.4)


def reference_gated_round(passes, accepts, verify_s, step_s, other_s):
    """One K's round written out stop by stop, as gated_rounds' docstring defines it."""
    k, tokens, seconds, reach, kept = len(passes), 1.0, other_s, 1.0, 1.0
    for d in range(k + 1):
        stop = reach * (1.0 - passes[d]) if d < k else reach
        seconds += stop * (verify_s[d] + step_s * min(d + 1, k))
        if d < k:
            reach *= passes[d]
            kept *= accepts[d]
            tokens += reach * kept
    return tokens, seconds


def test_every_k_of_a_gated_round_at_once_gives_each_ks_own_figures_bit_for_bit():
    """The controller weighs K = 1 .. 8 of a drafter each round from one pass; its choices must be
    the ones K-by-K rounds would make, so the figures are compared exactly, not approximately."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        k = int(torch.randint(1, 9, (1,), generator=generator))
        passes, accepts = torch.rand(k, generator=generator).tolist(), torch.rand(k, generator=generator).tolist()
        verify = (1.0 + torch.rand(k + 1, generator=generator).cumsum(0)).tolist()
        step, other = float(torch.rand(1, generator=generator)) / 5, float(torch.rand(1, generator=generator)) / 20
        every = gated_rounds(passes, accepts, verify, step, other)
        assert every == [reference_gated_round(passes[:j], accepts[:j], verify[: j + 1], step, other) for j in range(1, k + 1)]


def test_autoregress_stops_where_the_gate_says_and_reports_what_it_weighed():
    rows = [torch.tensor([4.0, 0.0, 0.0]), torch.tensor([0.0, 4.0, 0.0]), torch.tensor([0.0, 0.0, 0.0])]
    steps = []

    def step(token):
        steps.append(int(token))
        return rows[len(steps)]

    gate = DraftGate((1.0, 1.1, 1.2, 2.0), step_s=0.0)
    draft = autoregress(rows[0], step, 3, SamplingParams(), None, gate=gate)
    assert draft.tokens.tolist() == [0, 1]  # the third guess is a uniform third: not worth a row
    assert len(draft.confidence) == 3 and draft.confidence[2] == pytest.approx(1 / 3)
    assert steps == [0, 1]
    declined = autoregress(rows[2], step, 3, SamplingParams(), None, gate=DraftGate((1.0, 1.5), step_s=0.0))
    assert len(declined) == 0 and len(declined.confidence) == 1


def test_the_controller_learns_how_far_the_gate_lets_the_drafter_go():
    schedule = AdaptiveK(Prior(3, 0.5, 0.05))
    for _ in range(30):  # every round: the gate declines the first guess
        schedule.observe(RoundEvent(k=3, drafted=[], accepted=0, token=5, emitted=[5], draft_s=0.003, verify_s=0.05,
                                    finished=False, source="model", confidence=[0.1]))
    standing = schedule.standings["model"]
    assert standing.gated and standing.passes.rates(1)[0] < 0.1
    assert schedule.report()["gated_off"] == 30
    # A drafter whose gate never lets it draft costs a step a round and yields nothing: off.
    assert schedule.off


def greedy_tokens(engine, schedule, prompt, n=24):
    return [t for e in engine.generate(prompt, k=schedule, max_new_tokens=n) for t in e.emitted]


def test_gated_greedy_rounds_are_token_identical_to_plain_decoding(target, similar):
    prompt = [0, 5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6]
    plain = greedy_tokens(SpeculativeEngine(target, None, {1}), 0, prompt)
    schedule = AdaptiveK(Prior(3, 0.9, 0.0))
    engine = SpeculativeEngine(target, LookupFirst(ModelDrafter(similar, target.config.vocab_size)), {1})
    events = list(engine.generate(prompt, k=schedule, max_new_tokens=24))
    assert [t for e in events for t in e.emitted] == plain
    gated = [e for e in events if e.confidence is not None]
    assert gated and any(len(e.confidence) > len(e.drafted) for e in gated)  # the gate stopped some drafts


class GatedLearned(KSchedule):
    """The learned drafter every round, under a fixed gate."""

    reads_offer = True

    def __init__(self, gate):
        self.fixed, self.stopped = gate, 0

    def plan(self, offers, learned, room):
        return Plan(min(2, room), Take.LEARNED, learned)

    def gate(self, name, k):
        return self.fixed

    def observe(self, event):
        self.stopped += len(event.confidence or []) > len(event.drafted)


@pytest.mark.slow
def test_gated_sampling_keeps_the_targets_exact_distribution():
    """How long a draft is may depend on q, the drafter's own distribution: never on the target's.

    Three tokens a run (K 2 in the first round), each run held to plain decoding's. The draft model's
    largest q is 0.177 at the first position and 0.15-0.20 at the second, by the first token drawn:
    this gate drafts the first always and the second where its q peaks above 0.185 (about half).
    """
    target, disagreeing = small_models()
    sampling = SamplingParams(1.0)
    schedule = GatedLearned(DraftGate((1.0, 1.1, 1.578), step_s=0.0, calibration=5.0))
    assert_lossless(target, LookupFirst(ModelDrafter(disagreeing, VOCAB)), sampling, k=schedule, prompt=SMALL_PROMPT,
                    tokens=3)
    assert IDENTITY_RUNS / 3 < schedule.stopped < 2 * IDENTITY_RUNS / 3  # the gate stopped about half the first rounds' drafts
