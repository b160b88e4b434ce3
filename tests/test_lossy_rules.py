"""Relaxed (lossy) acceptance rules: their verdicts on hand-made p and q, the one parser, and proof
that they really change the sampled distribution (which the exact rule never does)."""

import math

import pytest
import torch
from exactness import (
    PROMPT,
    RUNS,
    VOCAB,
    assert_lossless,
    assert_same_distribution,
    exact_two_token_distribution,
    pair_counts,
    seeded_runs,
    small_models,
)
from scipy.stats import chisquare

from specdec_cli.decoding.acceptance import (
    AcceptRule,
    SamplingParams,
    greedy_accept,
    lenient_probability,
    parse_rule,
    relaxed_accept,
    top_keep,
    typical_keep,
)
from specdec_cli.decoding.drafters.model import ModelDrafter
from specdec_cli.errors import UserError

P = torch.tensor([0.5, 0.3, 0.15, 0.05])  # target
Q = torch.tensor([0.1, 0.2, 0.3, 0.4])  # draft
GREEDY = SamplingParams()
SAMPLE = SamplingParams(temperature=1.0)


@pytest.mark.parametrize("text, rule", [
    ("exact", AcceptRule()), ("lenient:2", AcceptRule("lenient", (2.0,))), ("typical:0.3,0.09", AcceptRule("typical", (0.3, 0.09))),
    ("top:3", AcceptRule("top", (3.0,))), (" top:1 ", AcceptRule("top", (1.0,))),
])
def test_parse_rule(text, rule):
    assert parse_rule(text) == rule
    assert str(rule) == text.strip()
    assert rule.lossless == (text == "exact")


@pytest.mark.parametrize("text", ["", "exact:1", "lenient", "lenient:0.5", "lenient:x", "typical:0.3", "typical:0,0.1",
                                  "typical:0.3,2", "top:0", "top:2.5", "top:3,4", "greedy"])
def test_parse_rule_refuses_in_one_line(text):
    with pytest.raises(UserError) as error:
        parse_rule(text)
    assert str(error.value) == (f"--accept {text!r}: expected exact, standard, lenient:L (L >= 1), typical:EPS,DELTA (both in (0, 1]) "
                                "or top:N (N >= 1)")


def test_lenient_probability_is_min_one_l_p_over_q():
    assert lenient_probability(torch.tensor(0.1), torch.tensor(0.4), 2.0).item() == pytest.approx(0.5)
    assert lenient_probability(torch.tensor(0.1), torch.tensor(0.4), 1.0).item() == pytest.approx(0.25)  # exact
    assert lenient_probability(torch.tensor(0.3), torch.tensor(0.4), 2.0).item() == 1.0


def test_typical_keeps_tokens_above_the_entropy_threshold():
    # H(P) = 1.1432 nats, exp(−H) = 0.3189: DELTA 0.4 → threshold 0.1277, DELTA 0.5 → 0.1596
    entropy = -sum(p * math.log(p) for p in P.tolist())
    assert 0.4 * math.exp(-entropy) == pytest.approx(0.1277, abs=1e-4)
    p = torch.stack([P] * 4)
    assert typical_keep(p, torch.tensor([0, 1, 2, 3]), 0.3, 0.4).tolist() == [True, True, True, False]
    assert typical_keep(p, torch.tensor([0, 1, 2, 3]), 0.3, 0.5).tolist() == [True, True, False, False]
    # EPS caps the threshold: at 0.2 only p > 0.2 survives (and always the argmax)
    assert typical_keep(p, torch.tensor([0, 1, 2, 3]), 0.2, 1.0).tolist() == [True, True, False, False]
    flat = torch.full((1, 4), 0.25)  # high entropy: a low threshold, even the argmax tie passes
    assert typical_keep(flat, torch.tensor([3]), 0.3, 0.5).tolist() == [True]
    # token 2 (0.15) is kept while DELTA < 0.15·exp(H) = 0.4704
    assert typical_keep(P[None], torch.tensor([2]), 0.3, 0.46).tolist() == [True]
    assert typical_keep(P[None], torch.tensor([2]), 0.3, 0.48).tolist() == [False]
    assert typical_keep(P[None], torch.tensor([1]), 0.3, 1.0).tolist() == [False]  # p(x) = EPS: not above it


def test_top_keeps_the_targets_n_most_likely():
    p = torch.stack([P] * 4)
    assert top_keep(p, torch.tensor([0, 1, 2, 3]), 2).tolist() == [True, True, False, False]
    assert top_keep(p, torch.tensor([3, 2, 1, 0]), 1).tolist() == [False, False, False, True]
    assert top_keep(p[:1], torch.tensor([3]), 9).tolist() == [True]  # N past the vocabulary: all


def _logits(*rows):
    return torch.log(torch.stack(rows))


def test_greedy_relaxed_verdicts():
    logits = _logits(P, P, P, P)
    draft = torch.tensor([1, 2, 3])
    # top:2 keeps token 1, stops at 2; the target adds its argmax 0
    assert relaxed_accept(AcceptRule("top", (2.0,)), draft, None, logits, GREEDY) == (1, 0)
    assert relaxed_accept(AcceptRule("top", (4.0,)), draft, None, logits, GREEDY) == (3, 0)  # all kept: bonus
    # lenient:2 under greedy keeps x when 2·p(x) ≥ max p = 0.5: token 1 (0.6) yes, token 2 (0.3) no
    assert relaxed_accept(AcceptRule("lenient", (2.0,)), draft, None, logits, GREEDY) == (1, 0)
    assert relaxed_accept(AcceptRule("lenient", (4.0,)), draft, None, logits, GREEDY) == (2, 0)
    assert relaxed_accept(AcceptRule("typical", (0.3, 0.4)), draft, None, logits, GREEDY) == (2, 0)
    assert relaxed_accept(AcceptRule("typical", (0.3, 0.5)), draft, None, logits, GREEDY) == (1, 0)
    # the exact argmax is always kept
    assert relaxed_accept(AcceptRule("top", (1.0,)), torch.tensor([0, 0]), None, logits[:3], GREEDY) == (2, 0)
    for rule in ("lenient:2", "typical:0.3,0.4", "top:2"):  # K = 0 (a budget's last round): the target's argmax
        assert relaxed_accept(parse_rule(rule), torch.tensor([], dtype=torch.long), None, logits[:1], GREEDY) == (0, 0)


def test_lenient_one_under_greedy_is_the_exact_rule():
    torch.manual_seed(0)
    for wrong in [0, 1, 2, None] * 5:  # the first wrong draft, or none
        logits = torch.randn(4, 4)
        draft = logits[:3].argmax(-1)
        if wrong is not None:
            draft[wrong] = (draft[wrong] + 1) % 4
        assert relaxed_accept(AcceptRule("lenient", (1.0,)), draft, None, logits, GREEDY) == greedy_accept(draft, logits)


def test_sampled_relaxed_tokens_after_a_rejection_and_after_every_draft_kept():
    """lenient: the residual after a rejection (never the draft's one-hot token), the bonus from the last row when
    all are kept; top and typical: p itself after a rejection, the rejected token included."""
    logits = torch.log(torch.tensor([[0.6, 0.4, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]))
    lenient, top = set(), set()
    for seed in range(40):
        lenient.add(relaxed_accept(AcceptRule("lenient", (1.0,)), torch.tensor([1]), None, logits, SAMPLE,
                                   torch.Generator().manual_seed(seed)))
        top.add(relaxed_accept(AcceptRule("top", (1.0,)), torch.tensor([1]), None, logits, SAMPLE,
                               torch.Generator().manual_seed(seed)))
    assert lenient == {(0, 0), (1, 3)} and top == {(0, 0), (0, 1)}


def test_lenient_rejects_a_token_the_target_gives_no_mass_even_at_u_zero(monkeypatch):
    monkeypatch.setattr(torch, "rand", lambda shape, generator=None, device=None: torch.zeros(shape))
    logits = torch.log(torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1.0]]))
    assert relaxed_accept(AcceptRule("lenient", (1.0,)), torch.tensor([2]), None, logits, SAMPLE) == (0, 0)


def _first_tokens(rule, draft_q, n=20000, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = _logits(P, P)
    counts = torch.zeros(4)
    for _ in range(n):
        x = torch.multinomial(draft_q, 1, generator=generator)
        accepted, token = relaxed_accept(rule, x, draft_q[None], logits, SAMPLE, generator)
        counts[int(x) if accepted else token] += 1
    return counts


@pytest.mark.slow
def test_lenient_one_is_the_exact_distribution_and_lenient_two_is_not():
    exact = _first_tokens(AcceptRule("lenient", (1.0,)), Q)
    assert chisquare(exact, P * exact.sum()).pvalue > 1e-3
    lossy = _first_tokens(AcceptRule("lenient", (2.0,)), Q)
    assert chisquare(lossy, P * lossy.sum()).pvalue < 1e-6
    # lenient:2 accepts x with min(1, 2p/q): 1, 1, 1, 0.25 → P(emit 3) = 0.4·0.25 = 0.1 instead of 0.05
    assert lossy[3] / lossy.sum() == pytest.approx(0.1, abs=0.01)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["top:3", "typical:0.3,0.3"])
def test_top_and_typical_change_the_first_token_distribution(rule):
    counts = _first_tokens(parse_rule(rule), Q)
    assert chisquare(counts, P * counts.sum()).pvalue < 1e-6


@pytest.mark.slow
def test_engine_with_a_lossy_rule_fails_the_exact_distribution_test():
    target, disagreeing = small_models()
    runs = seeded_runs(target, ModelDrafter(disagreeing, VOCAB), 2, SAMPLE, RUNS, PROMPT, rule=parse_rule("lenient:3"))
    with pytest.raises(AssertionError):
        assert_same_distribution(pair_counts(runs), exact_two_token_distribution(target, PROMPT, SAMPLE))


@pytest.mark.slow
def test_engine_with_the_exact_rule_passes_it():
    target, disagreeing = small_models()
    assert_lossless(target, ModelDrafter(disagreeing, VOCAB), SAMPLE, rule=AcceptRule())
