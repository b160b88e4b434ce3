"""A static store (``store``): draft what followed the same words in the target's own stored answers.

The suffix memory (suffix.py) learns from this process's answers and starts empty; on open questions
it rarely finds a match. The store is the same n-gram memory filled before the first prompt with
answers the target wrote earlier (for the default pair, its greedy answers to the project's training
prompts, none of them a bench prompt), as llama.cpp's ngram-cache keeps a static tier beside its
dynamic one. Half a million answer tokens hold millions of n-grams: as the memory's dictionaries
they cost hundreds of megabytes and seconds at every start (docs/notebook.md, "Drafters that learn
as they run"), so the store is a table instead (store_file.py: built once from the
answers file, kept in the cache and mapped).

A draft walks the table as suffix.continuation walks the memory: the longest known n-gram at the end
of the context, its successor, while the product of shares stays at least MIN_PROBABILITY and the
draft no longer than the first match. A hash collision can only make a draft wrong, never an
output: the target judges every token. A draft is tagged by its match's length (``store_source``),
so that the adaptive controller keeps apart estimates for long and short matches.
"""

from __future__ import annotations

import torch

from .base import Draft, Drafter
from .store_file import Table, opened_table
from .suffix import MAX_MATCH


def store_source(match: int) -> str:
    """A stored draft's source, by the length of the n-gram it continues."""
    return "store" if match >= 4 else f"store-{match}"


class StoreDrafter(Drafter):
    """Free to ask, like prompt lookup; it learns nothing as it runs (the suffix memory does that)."""

    name = "store"
    free = True

    def __init__(self, table: Table):
        self.table = table

    @classmethod
    def for_pair(cls, spec, vocab_size: int) -> StoreDrafter:
        return cls(opened_table(spec.answers, vocab_size))

    def fork(self) -> StoreDrafter:
        """Shared whole: every answer decoded beside another adds to what it learns, and reads it."""
        return self

    def propose(self, context, k, sampling, noise, gate=None) -> Draft:
        found, matched = self.table.continuation(context[-MAX_MATCH:].tolist(), k)
        return Draft(torch.tensor(found, dtype=torch.long), source=store_source(matched) if found else "")
