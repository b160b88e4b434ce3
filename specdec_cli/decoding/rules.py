"""Which acceptance rule a run uses: ``exact`` (the race: lossless, the seed fixes the text; the
default), ``standard`` (min(1, p/q) with a residual draw: lossless in distribution) or an opt-in lossy one.

Kept free of torch so that a bad ``--accept`` is refused before any model loads; the rules' math is in
``acceptance.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UserError

EXACT = "exact"
STANDARD = "standard"
LENIENT = "lenient"
TYPICAL = "typical"
TOP = "top"
RULE_SYNTAX = "exact, standard, lenient:L (L >= 1), typical:EPS,DELTA (both in (0, 1]) or top:N (N >= 1)"


@dataclass(frozen=True)
class AcceptRule:
    """How a draft token is judged. ``exact`` and ``standard`` are lossless; every other kind is lossy."""

    kind: str = EXACT
    params: tuple[float, ...] = ()

    @property
    def lossless(self) -> bool:
        """Each emitted token is distributed exactly as the target's p (greedy: is its argmax)."""
        return self.kind in (EXACT, STANDARD)

    @property
    def raced(self) -> bool:
        """The target's token is the race's winner (coupling.py): the seed fixes the text, whatever
        drafted it. Every other rule judges a chain on p and q and draws from a seeded generator whose
        draws follow the drafts (the standard rule's text is fixed by the seed for one drafter and K)."""
        return self.kind == EXACT

    def __str__(self) -> str:
        if not self.params:
            return self.kind
        return f"{self.kind}:" + ",".join(f"{int(v)}" if float(v).is_integer() else f"{v:g}" for v in self.params)


def parse_rule(text: str, origin: str = "--accept") -> AcceptRule:
    """'exact', 'standard', 'lenient:2', 'typical:0.3,0.09', 'top:3' → AcceptRule; anything else is a UserError."""
    kind, colon, rest = text.strip().partition(":")
    bad = UserError(f"{origin} {text!r}: expected {RULE_SYNTAX}")
    if kind in (EXACT, STANDARD):
        if colon:
            raise bad
        return AcceptRule(kind)
    try:
        values = tuple(float(v) for v in rest.split(",")) if colon else ()
    except ValueError:
        raise bad from None
    if not all(math.isfinite(v) for v in values):  # lenient:inf would keep every draft: random tokens
        raise UserError(f"{origin} {text!r}: its numbers must be finite; expected {RULE_SYNTAX}")
    if kind == LENIENT and len(values) == 1 and values[0] >= 1:
        return AcceptRule(LENIENT, values)
    if kind == TYPICAL and len(values) == 2 and all(0 < v <= 1 for v in values):
        return AcceptRule(TYPICAL, values)
    if kind == TOP and len(values) == 1 and values[0] >= 1 and values[0].is_integer():
        return AcceptRule(TOP, values)
    raise bad


def check_tree_rule(rule: AcceptRule) -> None:
    """Trees are verified exactly, by the race: every other rule judges a chain's drafts in order, which a
    tree's are not (min(1, p/q) over siblings would need a residual per rejected sibling)."""
    if not rule.raced:
        raise UserError(f"acceptance rule {rule} applies to chains of drafts; trees are verified exactly")
