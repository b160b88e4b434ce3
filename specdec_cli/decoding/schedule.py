"""What picks each round's draft: the interface the engine drives, and its simplest case, a fixed K.

An explicit base class rather than attributes the engine probes for: the optional parts are
declared here with their defaults (``picks_drafter``, ``trees``, ``gate``), and a schedule that has
them overrides them (the adaptive controller, control/adaptive.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .control.gate import DraftGate
from .events import RoundEvent


class KSchedule:
    """Chooses K before each round and sees how the round went (a fixed K, or an adaptive controller).

    ``choose()`` is K for the drafter as it is. A schedule that sets ``picks_drafter`` is asked
    ``plan(offer, offer_source, learned, room) -> (k, source)`` instead (when there is a drafter):
    it is shown prompt lookup's match first (``offer`` tokens long, 0 for none; free to find) and
    picks the round's drafter itself: the match (its first k tokens), the learned drafter (k tokens),
    or nothing; or, naming ``tree_source(learned)``, the learned drafter's tree of at most k nodes (a
    head's). ``gate(source, k)`` may then bound the learned drafter's chain by its confidence (gate.py).
    Each round's draft still comes whole from one drafter, with its q, so acceptance is unchanged.
    ``trees``: ``plan`` may name a tree, which no lossy acceptance rule applies to.
    """

    picks_drafter: bool = False
    trees: bool = False

    def choose(self) -> int:
        raise NotImplementedError

    def plan(self, offer: int, offer_source: str | None, learned: str | None, room: int) -> tuple[int, str | None]:
        raise NotImplementedError(f"{type(self).__name__} picks no drafter (picks_drafter is False)")

    def gate(self, source: str, k: int) -> DraftGate | None:
        """This round's gate for a chain of at most ``k`` drafts from ``source``; None: draft all k."""
        return None

    def observe(self, event: RoundEvent) -> None:
        """See how the round went."""


@dataclass
class FixedK(KSchedule):
    k: int

    def choose(self) -> int:
        return self.k
