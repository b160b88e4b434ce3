"""The confidence gate: a learned drafter stops where its next guess is not worth verifying.

A head's probability of its own guess predicts whether the target keeps it: on prompts it never saw,
the shipped head's unconfident first guesses were rarely kept and its confident ones nearly always
(docs/notebook.md, "Figures that were in the code's docstrings"). A fixed K drafts every round as if
all guesses were average; the gate drafts a token only when its chance of surviving, with those
before it, pays for it: another drafter step and a longer verify block. Adding it raises the round's
tokens per second E/T iff P·T > Δ·E (E expected tokens and T seconds of the round so far, Δ the
seconds it adds, P its chance). The controller fills in the seconds from its estimates each round
(adaptive.py).

The test reads only the drafter's own distribution before the token is drawn from it (its largest
probability), never the target's, so acceptance stays exact: how long a draft is changes how many
rounds the output takes, never which tokens it holds (greedy or sampled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class DraftGate:
    """The costs one round's gate weighs, in seconds (or any one unit)."""

    verify_s: tuple[float, ...]  # verifying d drafts (a block of d + 1 tokens), d = 0 .. the round's K
    step_s: float  # one drafter step (a head or model forward and its output layer)
    other_s: float = 0.0  # a round's bookkeeping
    calibration: float = 1.0  # the target's acceptance per unit of the drafter's confidence (estimates.Calibration)

    def chance(self, confidence: float) -> float:
        """The chance the target keeps a guess drafted at this confidence, given those before were kept."""
        return min(1.0, max(0.0, self.calibration * confidence))

    def worth(self, confidences: Sequence[float]) -> bool:
        """Draft the guess whose confidence is ``confidences[-1]``, those before it being drafted?"""
        drafted = len(confidences) - 1
        cap = len(self.verify_s) - 1
        if drafted >= cap:
            return False
        survive, tokens = 1.0, 1.0
        for confidence in confidences[:-1]:
            survive *= self.chance(confidence)
            tokens += survive
        survive *= self.chance(confidences[-1])
        seconds = self.verify_s[drafted] + self.step_s * (drafted + 1) + self.other_s
        added = self.verify_s[drafted + 1] - self.verify_s[drafted] + (self.step_s if drafted + 1 < cap else 0.0)
        return survive * seconds > added * tokens


def confidence(probs: torch.Tensor) -> float:
    """A drafter's confidence in its next guess: the largest probability of its distribution q (of
    the greedy choice; when sampling, read before the draw, so the gate cannot favour some draws)."""
    return float(probs.max())


def gated_rounds(passes: Sequence[float], accepts: Sequence[float], verify_s: Sequence[float], step_s: float,
                 other_s: float = 0.0) -> list[tuple[float, float]]:
    """Expected tokens and seconds of a gated round of at most K drafts, for K = 1 .. len(passes).

    ``passes[i]``: the chance the gate drafts position i, given it drafted those before;
    ``accepts[i]``: the chance the target keeps it, given it was drafted and those before were kept;
    ``verify_s[d]``: verifying d drafts. A round that stops at d < K drafts took d + 1 drafter
    steps (the last one weighed the guess it declined); one that reaches K took K. The stops
    before K are the same for every K ≥ d + 1, so one pass serves every K, each adding its own last stop.
    """
    found, tokens, seconds, reach, kept = [], 1.0, other_s, 1.0, 1.0
    for d in range(len(passes)):
        seconds += reach * (1.0 - passes[d]) * (verify_s[d] + step_s * (d + 1))  # stopped after d drafts
        reach *= passes[d]
        kept *= accepts[d]
        tokens += reach * kept
        found.append((tokens, seconds + reach * (verify_s[d + 1] + step_s * (d + 1))))  # reached K = d + 1
    return found
