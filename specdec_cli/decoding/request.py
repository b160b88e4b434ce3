"""One answer in progress, as the engine's rounds read and move it on (gpt-fast keeps these as its
loop's locals); the engine and the draft steps (drafting.py) share it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .acceptance import AcceptRule, SamplingParams
from .coupling import PositionNoise
from .drafters.base import Drafter
from .schedule import KSchedule


@dataclass
class Request:
    """One answer in progress: what each of its rounds reads and moves on (gpt-fast keeps these as its
    loop's locals). ``tokens`` are the prompt and the answer so far; the cache holds all but the last."""

    schedule: KSchedule
    cache: object
    tokens: torch.Tensor
    prompt_length: int
    budget: int  # tokens the answer may add
    limit: str  # what ends it when no EOS does: MAX_NEW_TOKENS or CONTEXT
    device: object
    sampling: SamplingParams
    noise: PositionNoise | None  # the race's, under sampling
    generator: torch.Generator | None  # the draws of a rule that judges p and q (not the race)
    rule: AcceptRule
    record_logits: bool
    fallbacks: int = 0  # the target's fallback forwards counted so far, for each event's own
    produced: int = 0
    key: object = None  # the caller's name for it, which ``run`` hands back with each event
    drafter: Drafter | None = None  # this answer's own (a fork of the engine's, when batched)
    prompted: bool = False  # its prompt is cached
    shared: int = 0  # prompt positions copied from another answer's cache (shared_prefix.py)
    prompt_features: torch.Tensor | None = None  # its own of the positions a prefix may share, kept in a batch

    @property
    def left(self) -> int:
        return self.budget - self.produced

    @property
    def cached(self) -> int:
        """Positions its cache holds once its prompt is cached and after every round: all but the last token."""
        return self.tokens.shape[0] - 1

    @property
    def unshared(self) -> int:
        """Prompt rows its own forward computes: those past a shared prefix (none: all of it was copied)."""
        return self.cached - self.shared
