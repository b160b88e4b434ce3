"""Plain decoding samples the target's exact two-token distribution under every sampling setting the
drafters' tests use (each of those holds its speculative runs to plain's, seed by seed); the check's
size holds: at RUNS it misses the classic sampling bug with probability under 1e-3 (exactness.py's
docstring), the power computation itself is right, and the identity check fails a sampler that keeps
drafts without asking the target."""

import pytest
import torch

from exactness import (
    PROMPT,
    RUNS,
    VOCAB,
    assert_same_as_plain,
    assert_same_distribution,
    exact_two_token_distribution,
    missed_rate,
    pair_counts,
    seeded_runs,
    small_models,
)
from specdec_cli.decoding.acceptance import SamplingParams, distribution


SETTINGS = [SamplingParams(1.0), SamplingParams(0.8), SamplingParams(0.7, top_k=5), SamplingParams(1.0, top_p=0.9)]


@pytest.mark.slow
@pytest.mark.parametrize("sampling", SETTINGS, ids=["t1", "t0.8", "top-k", "top-p"])
def test_plain_sampling_gives_the_targets_exact_two_token_distribution(sampling):
    """RUNS seeded plain runs against the enumerated P(a, b | prompt): what every drafter's identity
    check stands on."""
    target, _ = small_models()
    runs = seeded_runs(target, None, 0, sampling, RUNS, PROMPT)
    assert_same_distribution(pair_counts(runs), exact_two_token_distribution(target, PROMPT, sampling))


def classic_bug(target, draft, prompt, sampling):
    """The two-token distribution when one drafted token, rejected, is resampled from p rather than
    from the residual max(0, p - q): the first token's P becomes min(p, q) + (1 - Σ min(p, q)) p."""
    exact = exact_two_token_distribution(target, prompt, sampling).double().view(VOCAB, VOCAB)
    with torch.no_grad():
        p = distribution(target(torch.tensor([prompt])).logits[0, -1], sampling).double()
        q = distribution(draft(torch.tensor([prompt])).logits[0, -1], sampling).double()
    first = torch.minimum(p, q) + (1 - torch.minimum(p, q).sum()) * p
    return exact.flatten(), (first[:, None] * exact / p[:, None]).flatten()


def test_the_check_at_runs_misses_the_classic_bug_rarely():
    target, disagreeing = small_models()
    exact, wrong = classic_bug(target, disagreeing, [3, 4, 5], SamplingParams(1.0))
    assert 0.1 < (wrong - exact).abs().sum() / 2 < 0.12  # the bug moves 11 % of the probability
    assert missed_rate(exact, wrong) < 1e-3
    assert missed_rate(exact, wrong, RUNS // 2) > 1e-2  # half the runs would not be enough


def test_missed_rate_is_one_minus_the_power_of_the_chi_square_test():
    uniform = torch.full((16,), 1 / 16)
    assert abs(missed_rate(uniform, uniform, 1000) - (1 - 1e-3)) < 1e-9  # no difference: passes but for the test's own 1e-3
    skewed = uniform.clone()
    skewed[0], skewed[1] = 2 / 16, 0.0
    assert missed_rate(uniform, skewed, 1000) < 1e-8 < 0.5 < missed_rate(uniform, skewed, 100)  # λ 125 against 12.5


def test_the_identity_half_fails_a_sampler_that_keeps_drafts_without_the_test(monkeypatch):
    """IDENTITY_RUNS speculative runs against plain's: keep every draft unasked, and seeds differ."""
    from specdec_cli.decoding import engine as engine_module
    from specdec_cli.decoding.drafters.model import ModelDrafter

    target, disagreeing = small_models()
    monkeypatch.setattr(engine_module, "greedy_accept", lambda draft, scores: (len(draft), int(scores[len(draft)].argmax())))
    with pytest.raises(AssertionError, match="seeds gave other text than plain decoding"):
        assert_same_as_plain(target, ModelDrafter(disagreeing, VOCAB), 2, SamplingParams(1.0))
