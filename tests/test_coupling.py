"""The race that makes sampling drafter-invariant (decoding/coupling.py), alone: exact answers on
tiny distributions, and noise fixed by the seed and the answer's position alone."""

import pytest
import torch
from scipy.stats import chisquare

from specdec_cli.decoding.coupling import PositionNoise, exponential_of, exponentials, race_scores, race_winner

P = torch.tensor([0.5, 0.3, 0.15, 0.05])  # target
Q = torch.tensor([0.1, 0.2, 0.3, 0.4])  # draft, disagreeing strongly
DRAWS = 20_000  # at this many a winner that is off by 0.01 in one id's probability fails the chi-square


def winners(p: torch.Tensor, draws: int = DRAWS, seed: int = 0) -> torch.Tensor:
    return torch.stack([race_winner(p, exponentials(seed, i, p.shape[-1])) for i in range(draws)])


@pytest.mark.parametrize("p", [P, Q, torch.tensor([0.0, 0.6, 0.0, 0.4])], ids=["target", "draft", "truncated"])
def test_the_race_winner_is_a_draw_from_p(p):
    counts = torch.bincount(winners(p), minlength=4).double()
    assert counts[p == 0].sum() == 0
    assert chisquare(counts[p > 0], (p[p > 0] * DRAWS).double()).pvalue > 1e-3


def test_the_chi_square_at_these_draws_rejects_a_winner_slightly_off():
    """Power: the last id's probability moved by 0.02 (its share of the first's) is caught."""
    counts = torch.bincount(winners(P), minlength=4).double()
    off = torch.tensor([0.48, 0.3, 0.15, 0.07])
    assert chisquare(counts, (off * DRAWS).double()).pvalue < 1e-6


def test_shared_noise_keeps_a_close_draft_as_often_as_the_papers_bound_says():
    """P(q's winner is p's) ≥ (1 − TV) / (1 + TV) (Daliri et al., Theorem 2); 1 when q = p."""
    draft, target = winners(Q), winners(P)
    tv = 0.5 * float((P - Q).abs().sum())
    assert float((draft == target).double().mean()) >= (1 - tv) / (1 + tv) - 0.01
    assert torch.equal(winners(P, 200), winners(P.clone(), 200))


def test_a_fixed_draft_token_is_kept_with_the_chance_the_target_gives_it():
    assert float((winners(P) == 2).double().mean()) == pytest.approx(0.15, abs=0.01)


def test_noise_is_fixed_by_the_seed_and_the_position_in_the_answer_alone():
    a, b = PositionNoise(3, 16, origin=10), PositionNoise(3, 16, origin=4)  # two prompts' answers
    assert torch.equal(a.row(12), b.row(6)) and torch.equal(a.row(12), exponentials(3, 2, 16))
    assert torch.equal(a.rows([13, 12]), torch.stack([exponentials(3, 3, 16), exponentials(3, 2, 16)]))
    assert not torch.equal(a.row(12), a.row(13))
    assert not torch.equal(exponentials(3, 2, 16), exponentials(4, 2, 16))
    assert torch.equal(exponentials(2**64 + 3, 2, 16), exponentials(3, 2, 16))  # seeds are taken mod 2⁶⁴
    with pytest.raises(ValueError, match="before the answer began"):
        a.row(9)


def test_an_id_without_mass_never_wins():
    """A uniform draw of 0 is a finite exponential, so an id with all the mass scores above 0 and
    wins even under the largest noise; the ids without mass score 0."""
    noise = exponential_of(torch.tensor([0.5, 0.9, 0.9, 0.0]))
    assert torch.isfinite(noise).all()
    assert int(race_winner(torch.tensor([0.0, 0.0, 0.0, 1.0]), noise)) == 3
    assert race_scores(torch.tensor([0.0, 1.0, 0.0, 0.0]), noise)[[0, 2, 3]].eq(0).all()
