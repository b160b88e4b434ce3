"""What one verify round did, as every consumer reads it: the live view, JSON statistics, the
bench and the adaptive controller (control/adaptive.py). Plain data: no models, no clocks."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Why a run ended (RoundEvent.stop): the target wrote an end-of-sequence token, the answer reached
# max_new_tokens, or the target's context is full before either: the answer is cut short.
EOS, MAX_NEW_TOKENS, CONTEXT = "eos", "max_new_tokens", "context"


@dataclass
class RoundEvent:
    """What one verify round did.

    ``drafted`` are the proposed ids, of which the first ``accepted`` passed the target's test;
    ``token`` is the one the target chose itself (correction after a rejection, or bonus after full
    acceptance), None when EOS or the token budget ended the block before it. ``emitted`` is what
    the round appended to the output.
    """

    k: int
    drafted: list[int]
    accepted: int
    token: int | None
    emitted: list[int]
    draft_s: float
    verify_s: float
    finished: bool
    logits: torch.Tensor | None = field(default=None, repr=False)  # raw target rows for `emitted`, on request
    source: str = ""  # the drafter that drafted (Draft.source); "" when none was asked (or none drafted ungated)
    other_s: float = 0.0  # the round's bookkeeping after verifying (cache crop, features, the schedule's own work)
    catchup_s: float = 0.0  # part of draft_s: a head catching up after rounds without it (paid once per gap)
    offer_s: float = 0.0  # part of draft_s: the free drafters' ready drafts, found every round whoever drafts
    confidence: list[float] | None = None  # under a gate: the drafter's confidence per position weighed (Draft)
    fallback_forwards: int = 0  # target forwards its lean forward handed to transformers' since the last event (0 expected)
    # A tree round (tree.py): ``drafted`` are its nodes, ``parents`` their parents as block indices
    # (0 the root), ``accepted`` the length of the kept path, ``turned_down`` the children of the
    # path's last node, every one of which the target tested and refused. None for a chain.
    parents: tuple[int, ...] | None = None
    turned_down: list[int] | None = None
    path: list[int] | None = None  # a tree round's kept nodes, as block indices (1 the first draft node)
    cached: int = 0  # tokens in the target's cache when it verified the block: the context it attended over
    stop: str | None = None  # the last round's: why the run ended (EOS, MAX_NEW_TOKENS or CONTEXT); None before

    @property
    def nodes(self) -> int:
        """Draft tokens the target verified in this round's one forward (a chain's K, a tree's size)."""
        return len(self.drafted)

    @property
    def rejected(self) -> list[int]:
        if self.parents is not None:
            return list(self.turned_down or [])
        return self.drafted[self.accepted :]

    @property
    def judged(self) -> int:
        """Drafts the target tested: the kept ones and the first turned down. The speed-up formula's
        α is kept / judged; kept / drafted would also count drafts after a rejection, never tested.
        In a tree: the path's nodes and the refused children at its end."""
        if self.parents is not None:
            return self.accepted + len(self.turned_down or [])
        return self.accepted + (self.accepted < len(self.drafted))
