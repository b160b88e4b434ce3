"""Drafter-invariant sampling: each position's token is fixed by the seed, the position and the
target's distribution there, whatever drafted it (Daliri, Musco, Suresh, "Coupling without
Communication and Drafter-Invariant Speculative Decoding", 2024).

At the position a token will take, noise E (one standard exponential per vocabulary id) comes from a
counter-based stream keyed by (seed, position − prompt length) alone. The sampled token is the
winner of the exponential race, argmax p(x) / E(x): each id's E / p is exponential with rate p, so
the first to arrive is id x with probability exactly p(x) (the Gumbel-max trick in other clothes).

The target's token is then a function of its own distribution and the noise, so sampling is greedy
decoding of the scores p / E: a draft token is kept when it equals the target's winner at its
position. A drafter with a distribution of its own (a model, a head) drafts its winner under the
same noise, so the two agree often where q is close to p; a deterministic one (lookup, a tree's
candidates) is kept with chance p(x), as under the min(1, p/q) rule. No draft changes which random
numbers the target's tokens see, so K, the drafter, a tree and the timing that picks among them
leave the text unchanged, and plain decoding (K = 0) gives the same text as every speculative run.
It is the default rule (``--accept exact``). The standard rule (``--accept standard``, acceptance.py)
keeps more of a draft model's guesses, 1 − TV of them against the race's ≥ (1 − TV)/(1 + TV), and is
as lossless in distribution, but draws its own uniforms, so its text follows the drafts. A drafter
drafts under this noise either way: its winner is a draw from q, which is all that rule asks of it.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch


class PositionNoise:
    """The race's noise at each position of one answer: rows of ``vocab_size`` exponentials.

    Keyed by (seed, position − ``origin``), so an answer's i-th token sees the same noise whatever
    came before the answer and whatever ran beside it. A row is drawn once and kept while it may
    be asked for again (a round re-verifies the positions past the one it rejected at)."""

    def __init__(self, seed: int, vocab_size: int, origin: int):
        self.seed, self.vocab_size, self.origin = seed, vocab_size, origin
        self._rows: dict[int, torch.Tensor] = {}

    def rows(self, positions: Iterable[int]) -> torch.Tensor:
        """One row per position (positions in the context: the prompt's first token is 0)."""
        positions = list(positions)
        for stale in [p for p in self._rows if p < min(positions, default=0)]:
            del self._rows[stale]  # positions before the earliest asked for are settled
        return torch.stack([self.row(p) for p in positions])

    def row(self, position: int) -> torch.Tensor:
        if position not in self._rows:
            self._rows[position] = exponentials(self.seed, position - self.origin, self.vocab_size)
        return self._rows[position]


SMALLEST_UNIFORM = 2.0**-25  # half the float32 uniforms' step: what a draw of 0 stands for


def exponentials(seed: int, index: int, size: int) -> torch.Tensor:
    """``size`` standard exponentials from Philox keyed by (seed mod 2⁶⁴, index): counter-based, so
    one index's stream never overlaps another's."""
    if index < 0:
        raise ValueError(f"noise asked for position {index} before the answer began")
    uniform = np.random.Generator(np.random.Philox(key=seed % 2**64 + (index << 64))).random(size, dtype=np.float32)
    return exponential_of(torch.from_numpy(uniform))


def exponential_of(uniform: torch.Tensor) -> torch.Tensor:
    """−log U, finite: a draw of 0 (once in 2²⁴) counts as the middle of its step, not +inf, which
    would score an id with mass 0 and could let an id without mass win a one-id distribution."""
    return uniform.clamp_(min=SMALLEST_UNIFORM).log_().neg_()


def race_scores(p: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """p / E row by row: the argmax of a row is that position's sampled token. An id outside the
    distribution's support (top-k, top-p) scores 0 and never wins."""
    return p / noise.to(p.device)


def race_winner(p: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The sampled token of each row of ``p`` under ``noise`` (a 0-d tensor for one row)."""
    return race_scores(p, noise).argmax(dim=-1)
