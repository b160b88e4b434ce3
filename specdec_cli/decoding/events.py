"""What one verify round did, as every consumer reads it: the live view, JSON statistics, the
bench and the adaptive controller (control/adaptive.py). Plain data: no models, no clocks. RoundCounts is
their one fold, kept per run, per prompt and per drafter."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

# Why a run ended (RoundEvent.stop): the target wrote an end-of-sequence token, the answer reached
# max_new_tokens, or the target's context is full before either: the answer is cut short.
EOS, MAX_NEW_TOKENS, CONTEXT = "eos", "max_new_tokens", "context"


@dataclass(frozen=True)
class RoundEvent:
    """What one verify round did: made once, at the round's end, and read by everyone after.

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
    batch: int = 1  # answers whose rounds the same target forward verified (1: this one alone)

    @property
    def nodes(self) -> int:
        """Draft tokens the target verified in this round's one forward (a chain's K, a tree's size)."""
        return len(self.drafted)

    @property
    def asked(self) -> bool:
        """Whether a drafter was asked this round: it drafted, or its gate weighed a first guess and declined."""
        return bool(self.drafted) or bool(self.confidence)

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


@dataclass(kw_only=True)
class RoundCounts:
    """The sums every consumer of round events keeps (generate's statistics, bench's samples,
    calibration's tallies): one fold, so that a figure means the same wherever it is read."""

    rounds: int = 0
    k_total: int = 0  # the K planned, summed over rounds
    drafted: int = 0
    accepted: int = 0
    judged: int = 0  # drafts the target tested (RoundEvent.judged): those after a rejection are not
    new_tokens: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0  # rounds' bookkeeping outside draft and verify
    tree_rounds: int = 0
    fallback_forwards: int = 0  # target forwards that left the lean forward (events.py): 0 expected

    def add(self, event: RoundEvent) -> None:
        self.rounds += 1
        self.k_total += event.k
        self.drafted += len(event.drafted)
        self.accepted += event.accepted
        self.judged += event.judged
        self.new_tokens += len(event.emitted)
        self.draft_s += event.draft_s
        self.verify_s += event.verify_s
        self.other_s += event.other_s
        self.tree_rounds += event.parents is not None
        self.fallback_forwards += event.fallback_forwards

    def drafter_figures(self) -> dict:
        """One drafter's figures over the rounds it was asked (RoundEvent.asked), as generate's
        statistics and bench report them: α is kept / judged, a round's tokens its kept drafts and the
        target's own."""
        return {"rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
                "alpha": round(self.accepted / self.judged, 4) if self.judged else None,
                "tokens_per_round": round((self.accepted + self.rounds) / self.rounds, 3) if self.rounds else None,
                "draft_s": round(self.draft_s, 4)}

    def merge(self, other: "RoundCounts") -> None:
        for name in (f.name for f in fields(RoundCounts)):
            setattr(self, name, getattr(self, name) + getattr(other, name))
