"""Token recycling: draft from what the target itself predicted after each token, the last time it saw it.

Every verify forward already yields the target's distribution after each row of its block; the
runners-up it did not emit are thrown away. Token Recycling (Luo et al., ACL 2025) keeps them: a
table of each token's top successors, a whole row replaced each time the token is verified again,
and a draft that walks the table from the last token, its first successor at every step. It costs a
top-k of the verify rows and an index per drafted token, needs no training, and works for any
target. A draft is tagged by how many times in a row the target chose the same successor after its
first token (``recycle_source``): the more times, the more often the target keeps the draft
(priors.FREE_RATES), so the adaptive controller keeps apart estimates for each. The table is kept
across prompts: which token follows which depends on the target far more than on one prompt. It
holds token ids the target predicted after the user's own text.
"""

from __future__ import annotations

import torch

from .base import Draft, Drafter, Needs, Verified

# Successors kept per token. The paper keeps 8 and drafts a tree from them; a chain reads only the
# first, and one is an argmax of the verify rows (base.top_ids) where 8 are a top-k, several times
# dearer, paid every round (docs/notebook.md, "Drafters that learn as they run").
WIDTH = 1
DEPTH = 8  # the longest walk: past it a chain of first successors is kept too rarely to verify


class RecycleDrafter(Drafter):
    """Drafts the chain of first successors from the table; free to ask, so a schedule weighing
    drafters sees its draft every round, and it learns from every round, drafting or not."""

    name = "recycle"
    free = True
    needs = Needs(successors=WIDTH)

    def __init__(self, vocab_size: int):
        # -1: never verified. int32, vocab × WIDTH: 0.2 MB a successor for a 49k vocabulary.
        self.table = torch.full((vocab_size, WIDTH), -1, dtype=torch.int32)
        self.seen = torch.zeros(vocab_size, dtype=torch.int32)  # times in a row the first successor was chosen

    @classmethod
    def for_pair(cls, spec, vocab_size: int) -> RecycleDrafter:
        return cls(vocab_size)

    def observe(self, verified: Verified) -> None:
        if verified.block is not None and verified.successors is not None:
            rows, first = verified.block, verified.successors[:, 0].to(torch.int32)
            self.seen[rows] = torch.where(self.table[rows, 0] == first, self.seen[rows] + 1, 1)
            self.table[rows] = verified.successors.to(torch.int32)

    def fork(self) -> RecycleDrafter:
        """Shared whole: every answer decoded beside another adds to what it learns, and reads it."""
        return self

    def propose(self, context, k, sampling, noise, gate=None) -> Draft:
        last = int(context[-1])
        found = walk(self.table, last, min(k, DEPTH))
        return Draft(torch.tensor(found, dtype=torch.long), source=recycle_source(int(self.seen[last])) if found else "")


def recycle_source(seen: int) -> str:
    """A recycled draft's source, by how many times in a row its first token was the target's choice."""
    return "recycle" if seen >= 3 else f"recycle-{seen}"


def walk(table: torch.Tensor, token: int, k: int) -> list[int]:
    """Up to ``k`` tokens: each the first recorded successor of the one before, from ``token``;
    the walk stops at a token never verified."""
    found = []
    for _ in range(k):
        token = int(table[token, 0])
        if token < 0:
            break
        found.append(token)
    return found
