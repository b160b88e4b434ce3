"""A static store: draft what followed the same words in the target's own stored answers.

The suffix memory (suffix.py) learns from this process's answers and starts empty; on open questions
it rarely finds a match. The store is the same n-gram memory filled before the first prompt with
answers the target wrote earlier (for the default pair, its greedy answers to the project's training
prompts, none of them a bench prompt), as llama.cpp's ngram-cache keeps a static tier beside its
dynamic one. Half a million answer tokens hold 1.8M n-grams: as the memory's dictionaries that is
627 MB and 2.8 s at every start, so the store is a table instead (store_file.py builds it once and
maps it): for every n-gram of MIN_MATCH to MAX_MATCH tokens, a 64-bit hash, sorted, with the
successor seen most often after it (ties: the smallest id) and that successor's share of its count.

A draft walks the table as suffix.continuation walks the memory: the longest known n-gram at the end
of the context, its successor, while the product of shares stays at least MIN_PROBABILITY and the
draft no longer than the first match. A hash collision can only make a draft wrong, never an
output: the target judges every token. A draft is tagged by its match's length (``store_source``),
so that the adaptive controller keeps apart estimates for long and short matches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .drafters import Draft, Drafter
from .suffix import MAX_MATCH, MIN_MATCH, MIN_PROBABILITY, SPEC_FACTOR

PRIME = 0x100000001B3  # FNV-1a's 64-bit prime; the hash is polynomial in it, over (n, tokens + 1)
MASK = (1 << 64) - 1


@dataclass(frozen=True)
class Table:
    """Sorted n-gram hashes, each with its likeliest successor and that successor's share."""

    keys: np.ndarray  # uint64, sorted
    successors: np.ndarray  # int32
    shares: np.ndarray  # float32

    def longest(self, tail: list[int]) -> tuple[int, int]:
        """(row, n): the longest n-gram ending ``tail`` that the table knows; (-1, 0) for none."""
        lengths = range(min(MAX_MATCH, len(tail)), MIN_MATCH - 1, -1)
        hashes = np.array([tail_hash(tail[-n:]) for n in lengths], dtype=np.uint64)
        if not len(hashes):
            return -1, 0
        rows = np.searchsorted(self.keys, hashes)
        for n, h, row in zip(lengths, hashes, rows):
            if row < len(self.keys) and self.keys[row] == h:
                return int(row), n
        return -1, 0

    def continuation(self, tail: list[int], k: int, factor: float = SPEC_FACTOR,
                     floor: float = MIN_PROBABILITY) -> tuple[list[int], int]:
        """Up to ``k`` tokens after ``tail`` and the first match's length (suffix.continuation's rule:
        no longer than ``factor`` times the match, while the product of shares stays ≥ ``floor``)."""
        row, matched = self.longest(tail)
        limit = min(k, int(factor * matched))
        found, chance, tail = [], 1.0, list(tail)
        while len(found) < limit and row >= 0:
            chance *= float(self.shares[row])
            if chance < floor:
                break
            found.append(int(self.successors[row]))
            tail.append(found[-1])
            row, _ = self.longest(tail[-MAX_MATCH:])
        return found, matched


def tail_hash(tokens: list[int]) -> int:
    """The hash of one n-gram, as window_hashes makes it."""
    h = len(tokens)
    for t in tokens:
        h = (h * PRIME + t + 1) & MASK
    return h


def window_hashes(tokens: np.ndarray, n: int, ends: np.ndarray) -> np.ndarray:
    """The hash of tokens[end - n:end] for each end (uint64 arithmetic wraps as MASK does)."""
    h = np.full(ends.shape, n, dtype=np.uint64)
    for j in range(n):
        h = h * np.uint64(PRIME) + tokens[ends - n + j].astype(np.uint64) + np.uint64(1)
    return h


def build_table(answers: list[tuple[list[int], int]]) -> Table:
    """The table of every n-gram → next-token pair of the answers, each given as (tokens, lead): the
    first ``lead`` tokens only lead into the answer (a template's header), as the memory counts them."""
    keys, nexts = [], []
    for tokens, lead in answers:
        array = np.asarray(tokens, dtype=np.int64)
        for n in range(MIN_MATCH, MAX_MATCH + 1):
            ends = np.arange(max(lead, 1, n), len(array))
            keys.append(window_hashes(array, n, ends))
            nexts.append(array[ends])
    if not keys or not sum(map(len, keys)):
        return Table(np.empty(0, np.uint64), np.empty(0, np.int32), np.empty(0, np.float32))
    keys, nexts = np.concatenate(keys), np.concatenate(nexts)
    order = np.lexsort((nexts, keys))
    keys, nexts = keys[order], nexts[order]
    pair_start = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]) | (nexts[1:] != nexts[:-1])])
    pair_count = np.diff(np.r_[pair_start, len(keys)])
    pair_key, pair_next = keys[pair_start], nexts[pair_start]
    key_start = np.flatnonzero(np.r_[True, pair_key[1:] != pair_key[:-1]])
    totals = np.add.reduceat(pair_count, key_start)
    group = np.repeat(np.arange(len(key_start)), np.diff(np.r_[key_start, len(pair_key)]))
    best = np.lexsort((-pair_count, group))[key_start]  # each key's largest count; ties: the smallest id
    return Table(pair_key[key_start], pair_next[best].astype(np.int32), (pair_count[best] / totals).astype(np.float32))


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
        from .store_file import opened_table

        return cls(opened_table(spec.answers, vocab_size))

    def propose(self, context, k, sampling, noise, gate=None) -> Draft:
        found, matched = self.table.continuation(context[-MAX_MATCH:].tolist(), k)
        return Draft(torch.tensor(found, dtype=torch.long), source=store_source(matched) if found else "")
