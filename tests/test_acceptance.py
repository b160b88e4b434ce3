"""The acceptance math alone: exact answers on tiny distributions."""

import pytest
import torch
from scipy.stats import chisquare

from specdec_cli.decoding.acceptance import (
    SamplingParams,
    acceptance_probability,
    distribution,
    greedy_accept,
    residual_distribution,
    speculative_accept,
)

P = torch.tensor([0.5, 0.3, 0.15, 0.05])  # target
Q = torch.tensor([0.1, 0.2, 0.3, 0.4])  # draft, disagreeing strongly


def test_greedy_accepts_longest_matching_prefix_and_returns_target_choice():
    logits = torch.tensor([[0.0, 9, 0], [0, 0, 9], [9, 0, 0], [0, 9, 0]])  # argmax 1, 2, 0, 1
    assert greedy_accept(torch.tensor([1, 2, 2]), logits) == (2, 0)
    assert greedy_accept(torch.tensor([0, 2, 0]), logits) == (0, 1)
    assert greedy_accept(torch.tensor([1, 2, 0]), logits) == (3, 1)  # all accepted: bonus from the last row
    assert greedy_accept(torch.tensor([], dtype=torch.long), logits[:1]) == (0, 1)  # K = 0: plain decoding


def test_acceptance_probability_is_min_one_p_over_q():
    assert acceptance_probability(torch.tensor(0.2), torch.tensor(0.4)).item() == pytest.approx(0.5)
    assert acceptance_probability(torch.tensor(0.6), torch.tensor(0.3)).item() == 1.0


def test_residual_is_normalised_positive_part_of_p_minus_q():
    expected = torch.tensor([0.4, 0.1, 0.0, 0.0]) / 0.5
    assert torch.allclose(residual_distribution(P, Q), expected)
    assert torch.equal(residual_distribution(P, P), P)  # never an all-zero row


def _first_tokens(accept, draft_q, n=20000, seed=0):
    """Emitted first token over n rounds of K=1, the draft token drawn from draft_q."""
    generator = torch.Generator().manual_seed(seed)
    p = torch.stack([P, P])
    counts = torch.zeros(4)
    for _ in range(n):
        x = torch.multinomial(draft_q, 1, generator=generator)
        accepted, token = accept(x, None if draft_q is ONE_HOT else draft_q[None], p, generator)
        counts[int(x) if accepted else token] += 1
    return counts


ONE_HOT = torch.tensor([0.0, 0.0, 1.0, 0.0])


@pytest.mark.parametrize("draft_q", [Q, P, ONE_HOT], ids=["disagreeing", "identical", "deterministic"])
def test_emitted_token_is_distributed_as_target(draft_q):
    counts = _first_tokens(speculative_accept, draft_q)
    assert chisquare(counts, P * counts.sum()).pvalue > 1e-3


def test_distribution_test_catches_a_sampler_that_skips_the_acceptance_test():
    def accept_everything(draft, q, p, generator):
        return len(draft), 0

    counts = _first_tokens(accept_everything, Q)
    assert chisquare(counts, P * counts.sum()).pvalue < 1e-6


def test_acceptance_rate_matches_theory():
    """E[accept] = sum_x min(p(x), q(x)) = 1 - TV(p, q)."""
    counts = torch.zeros(2)
    generator = torch.Generator().manual_seed(1)
    for _ in range(20000):
        x = torch.multinomial(Q, 1, generator=generator)
        accepted, _ = speculative_accept(x, Q[None], torch.stack([P, P]), generator)
        counts[accepted] += 1
    expected = torch.minimum(P, Q).sum()
    assert counts[1] / counts.sum() == pytest.approx(float(expected), abs=0.01)


def test_warping_applies_temperature_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.allclose(distribution(logits, SamplingParams(1.0)), P[None])
    top2 = distribution(logits, SamplingParams(1.0, top_k=2))
    assert torch.allclose(top2, torch.tensor([[0.625, 0.375, 0, 0]]))
    nucleus = distribution(logits, SamplingParams(1.0, top_p=0.7))  # smallest set with mass >= 0.7: {0, 1}
    assert torch.allclose(nucleus, torch.tensor([[0.625, 0.375, 0, 0]]))
    hot = distribution(logits, SamplingParams(0.5))
    assert torch.allclose(hot, (P**2 / (P**2).sum())[None])


def test_top_k_one_is_the_argmax():
    assert torch.equal(distribution(torch.log(P)[None], SamplingParams(1.0, top_k=1)), torch.tensor([[1.0, 0, 0, 0]]))


def test_only_the_warpers_that_change_something_are_built():
    """None at all without warping (a greedy run never imports transformers' logits processors); temperature 1
    and top-p 1 add none; top-k and top-p beside temperature 0 (the CLI allows them) add no temperature warper."""
    def names(params):
        return None if params.warpers is None else [type(w).__name__ for w in params.warpers]

    assert names(SamplingParams()) is None and names(SamplingParams(1.0)) is None
    assert names(SamplingParams(1.0, top_k=2)) == ["TopKLogitsWarper"]
    assert names(SamplingParams(0.5, top_p=0.9)) == ["TemperatureLogitsWarper", "TopPLogitsWarper"]
    assert names(SamplingParams(0.0, top_k=2, top_p=0.5)) == ["TopKLogitsWarper", "TopPLogitsWarper"]


def zero_u(shape, generator=None, device=None):
    """torch.rand's smallest draw: u ~ U[0, 1) is 0 once in 2^24 float32 draws."""
    return torch.zeros(shape)


def test_a_token_the_target_gives_no_mass_is_rejected_even_at_u_zero(monkeypatch):
    """Accept when u < p(x)/q(x): at p(x) = 0 no u accepts, so the token is never emitted."""
    monkeypatch.setattr(torch, "rand", zero_u)
    p = torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1.0]])
    assert speculative_accept(torch.tensor([2]), None, p) == (0, 0)
    assert speculative_accept(torch.tensor([2]), ONE_HOT[None], p) == (0, 0)
