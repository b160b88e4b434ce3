"""The acceptance math alone: exact answers on tiny distributions (the race that samples: test_coupling.py)."""

import torch

from specdec_cli.decoding.acceptance import SamplingParams, distribution, greedy_accept, residual_distribution

P = torch.tensor([0.5, 0.3, 0.15, 0.05])  # target
Q = torch.tensor([0.1, 0.2, 0.3, 0.4])  # draft, disagreeing strongly


def test_greedy_accepts_longest_matching_prefix_and_returns_target_choice():
    logits = torch.tensor([[0.0, 9, 0], [0, 0, 9], [9, 0, 0], [0, 9, 0]])  # argmax 1, 2, 0, 1
    assert greedy_accept(torch.tensor([1, 2, 2]), logits) == (2, 0)
    assert greedy_accept(torch.tensor([0, 2, 0]), logits) == (0, 1)
    assert greedy_accept(torch.tensor([1, 2, 0]), logits) == (3, 1)  # all accepted: bonus from the last row
    assert greedy_accept(torch.tensor([], dtype=torch.long), logits[:1]) == (0, 1)  # K = 0: plain decoding


def test_residual_is_normalised_positive_part_of_p_minus_q():
    expected = torch.tensor([0.4, 0.1, 0.0, 0.0]) / 0.5
    assert torch.allclose(residual_distribution(P, Q), expected)
    assert torch.equal(residual_distribution(P, P), P)  # never an all-zero row


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
