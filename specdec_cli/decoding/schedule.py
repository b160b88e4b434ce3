"""What picks each round's draft: the interface the engine drives, and its simplest case, a fixed K.

An explicit base class rather than attributes the engine probes for: the optional parts are
declared here with their defaults (``reads_offer``, ``trees``, ``gate``), and a schedule that has
them overrides them (the adaptive controller, control/adaptive.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .control.gate import DraftGate
from .events import RoundEvent


class Take(Enum):
    """Where a round's draft comes from."""

    NOTHING = "nothing"  # plain decoding this round
    AS_IS = "as-is"  # the drafter as it is, whatever it combines (a fixed K's): k tokens, or a tree drafter's k nodes
    OFFER = "offer"  # a free drafter's ready draft, its first k tokens
    LEARNED = "learned"  # the learned drafter (a model or a head): a chain of at most k, gated where the schedule says
    TREE = "tree"  # the learned drafter's tree of at most k nodes (a head's)


@dataclass(frozen=True)
class Plan:
    """One round's draft as a schedule decides it: how many tokens (a tree's: nodes), from where, and
    the drafter the estimates are kept under (the offer's source, or the learned drafter's name)."""

    k: int
    take: Take
    source: str = ""

    @classmethod
    def nothing(cls) -> "Plan":
        return cls(0, Take.NOTHING)


class KSchedule:
    """Plans each round's draft and sees how the round went (a fixed K, or an adaptive controller).

    ``plan(offers, learned, room) -> Plan`` chooses among the drafter as it is, a free drafter's
    ready draft (``offers``: source → its length; shown only to a schedule that ``reads_offer``, else
    empty), the learned drafter (``learned``, its name: a chain, or its tree) and nothing. ``room``
    is the deepest chain the token budget still uses. ``context(cached)``, called before each plan,
    says how long a context the round's block will attend over (what it costs). ``gate(source, k)``
    may then bound a chain by the drafter's confidence (gate.py). Each round's draft still comes whole
    from one drafter, with its q, so acceptance is unchanged. ``trees``: ``plan`` may choose a tree,
    which no lossy acceptance rule applies to.
    """

    reads_offer: bool = False
    trees: bool = False

    def plan(self, offers: dict[str, int], learned: str | None, room: int) -> Plan:
        raise NotImplementedError

    def context(self, cached: int) -> None:
        """The round about to be planned verifies over ``cached`` tokens of context."""

    def gate(self, source: str, k: int) -> DraftGate | None:
        """This round's gate for a chain of at most ``k`` drafts from ``source``; None: draft all k."""
        return None

    def observe(self, event: RoundEvent) -> None:
        """See how the round went."""

    def gains(self, plan: Plan) -> tuple[list[float], float] | None:
        """A chain plan's expected tokens by its drafts (index j: a round with j drafts), and the
        seconds a drafted token takes its drafter, which a batch weighs against what its rows cost;
        None: the plan is kept as it is (what a fixed K says)."""
        return None

    def end(self) -> None:
        """The answer it planned for is over (finished, stopped or refused): one kept for an answer at a
        time may serve another."""


@dataclass
class FixedK(KSchedule):
    """K every round from the drafter as it is: a schedule that plans one drafter."""

    k: int

    def plan(self, offers: dict[str, int], learned: str | None, room: int) -> Plan:
        return Plan(self.k, Take.AS_IS)
