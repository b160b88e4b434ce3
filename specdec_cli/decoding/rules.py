"""Which acceptance rule a run uses: ``exact`` (lossless, the default) or an opt-in lossy one.

Kept free of torch so that a bad ``--accept`` is refused before any model loads; the rules' math is in
``acceptance.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UserError

EXACT = "exact"
LENIENT = "lenient"
TYPICAL = "typical"
TOP = "top"
RULE_SYNTAX = "exact, lenient:L (L >= 1), typical:EPS,DELTA (both in (0, 1]) or top:N (N >= 1)"


@dataclass(frozen=True)
class AcceptRule:
    """How a draft token is judged. ``exact`` is the lossless test; every other kind is lossy."""

    kind: str = EXACT
    params: tuple[float, ...] = ()

    @property
    def lossless(self) -> bool:
        return self.kind == EXACT

    def __str__(self) -> str:
        if not self.params:
            return self.kind
        return f"{self.kind}:" + ",".join(f"{int(v)}" if float(v).is_integer() else f"{v:g}" for v in self.params)


def parse_rule(text: str, origin: str = "--accept") -> AcceptRule:
    """'exact', 'lenient:2', 'typical:0.3,0.09', 'top:3' → AcceptRule; anything else is a UserError."""
    kind, colon, rest = text.strip().partition(":")
    bad = UserError(f"{origin} {text!r}: expected {RULE_SYNTAX}")
    if kind == EXACT:
        if colon:
            raise bad
        return AcceptRule()
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
    """Trees are verified exactly: a lossy rule judges a chain's drafts in order, which a tree's are not."""
    if not rule.lossless:
        raise UserError(f"acceptance rule {rule} applies to chains of drafts; trees are verified exactly")
