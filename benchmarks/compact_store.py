"""Is a static store feasible as a file? The stored greedy answers (examples/answers/) as sorted
n-gram hashes with each one's likeliest successor and its share, against the suffix memory's
dictionaries holding the same answers: size, time to build and to load, time a draft takes, and
whether the two draft the same tokens on the unseen prompts' plain answers.

    python3 benchmarks/compact_store.py --tokens 600000

The file form: for every n-gram of 2 to 8 tokens ending before an answer token (leads into the
answer included, as the suffix memory counts them), a 64-bit polynomial hash of (n, tokens); per
hash, the successor seen most often (ties: the smallest id, where the memory keeps the first seen)
and its share of the hash's count, as int32 and float32 (16 bits each would do for this vocabulary). A
draft walks it as suffix.continuation walks the dictionaries: the longest known n-gram at the end
of the context, its successor, while the product of shares stays at least MIN_PROBABILITY and the
draft no longer than the first match. Hash collisions can only make a draft wrong, never an output:
the target verifies every draft.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from static_store_replay import filled_store, stored_answers

from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.decoding.suffix import MAX_MATCH, MIN_MATCH, MIN_PROBABILITY, SPEC_FACTOR, continuation
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file

PRIME = np.uint64(0x100000001B3)
MASK = (1 << 64) - 1


def window_hashes(tokens: np.ndarray, n: int, ends: np.ndarray) -> np.ndarray:
    """The hash of tokens[end - n:end] for each end."""
    h = np.full(ends.shape, n, dtype=np.uint64)
    for j in range(n):
        h = h * PRIME + tokens[ends - n + j].astype(np.uint64) + np.uint64(1)
    return h


def tail_hashes(tail: list[int]) -> list[int]:
    """Hashes of the tail's last n tokens, n = MAX_MATCH down to MIN_MATCH, as window_hashes makes them."""
    found = []
    for n in range(min(MAX_MATCH, len(tail)), MIN_MATCH - 1, -1):
        h = n
        for t in tail[-n:]:
            h = (h * 0x100000001B3 + t + 1) & MASK
        found.append(h)
    return found


def build(stored: list[tuple[list[int], int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted hashes, successor, share) over every n-gram → next-token pair of the answers."""
    keys, nexts = [], []
    for tokens, lead in stored:
        array = np.asarray(tokens, dtype=np.int64)
        for n in range(MIN_MATCH, MAX_MATCH + 1):
            ends = np.arange(max(lead, 1, n), len(array))
            if len(ends):
                keys.append(window_hashes(array, n, ends))
                nexts.append(array[ends])
    keys, nexts = np.concatenate(keys), np.concatenate(nexts)
    order = np.lexsort((nexts, keys))
    keys, nexts = keys[order], nexts[order]
    pair_start = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]) | (nexts[1:] != nexts[:-1])])
    pair_count = np.diff(np.r_[pair_start, len(keys)])
    pair_key, pair_next = keys[pair_start], nexts[pair_start]
    key_start = np.flatnonzero(np.r_[True, pair_key[1:] != pair_key[:-1]])
    totals = np.add.reduceat(pair_count, key_start)
    # the likeliest successor of each key: the largest count in its run of pairs (ties: the first, the smallest id)
    group = np.repeat(np.arange(len(key_start)), np.diff(np.r_[key_start, len(pair_key)]))
    best = np.lexsort((-pair_count, group))[key_start]  # within each group, the largest count first
    return pair_key[key_start], pair_next[best].astype(np.int32), (pair_count[best] / totals).astype(np.float32)


def compact_continuation(keys, successors, shares, tail: list[int], k: int) -> tuple[list[int], int]:
    """suffix.continuation over the file form."""
    matched = 0
    hashes = tail_hashes(tail)
    at = np.searchsorted(keys, np.array(hashes, dtype=np.uint64))
    for offset, (h, i) in enumerate(zip(hashes, at)):
        if i < len(keys) and keys[i] == h:
            matched = min(MAX_MATCH, len(tail)) - offset
            break
    limit = min(k, int(SPEC_FACTOR * matched))
    found, chance, tail = [], 1.0, list(tail)
    while len(found) < limit:
        hashes = tail_hashes(tail)
        at = np.searchsorted(keys, np.array(hashes, dtype=np.uint64))
        index = next((i for h, i in zip(hashes, at) if i < len(keys) and keys[i] == h), None)
        if index is None:
            break
        chance *= float(shares[index])
        if chance < MIN_PROBABILITY:
            break
        found.append(int(successors[index]))
        tail.append(found[-1])
    return found, matched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="benchmarks/unseen-prompts.jsonl")
    parser.add_argument("--tokens", type=int, default=600_000, help="answer tokens in the store")
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()
    stored = stored_answers(args.tokens)
    started = time.perf_counter()
    keys, successors, shares = build(stored)
    built_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as directory:
        for name, array in (("keys", keys), ("successors", successors), ("shares", shares)):
            np.save(Path(directory) / f"{name}.npy", array)
        size = sum(p.stat().st_size for p in Path(directory).iterdir())
        started = time.perf_counter()
        keys, successors, shares = (np.load(Path(directory) / f"{name}.npy", mmap_mode="r")
                                    for name in ("keys", "successors", "shares"))
        loaded_s = time.perf_counter() - started
        started = time.perf_counter()
        memory, filled = filled_store(args.tokens)
        dictionaries_s = time.perf_counter() - started
        runtime = load_pair(load_registry().pair(None))
        plain = SpeculativeEngine(runtime.target.model, None, runtime.eos_token_ids, runtime.block_plan)
        same = drafts = 0
        compact_s = dict_s = 0.0
        for prompt in read_file(args.prompts):
            ids = encode_prompt(runtime.tokenizer, prompt.text)
            context = ids + [t for e in plain.generate(ids, k=0, max_new_tokens=64) for t in e.emitted]
            for step in range(len(ids), len(context)):
                tail = context[max(step - MAX_MATCH, 0):step]
                t0 = time.perf_counter()
                mine = compact_continuation(keys, successors, shares, tail, args.depth)
                t1 = time.perf_counter()
                theirs = continuation(memory.counts, tail, args.depth)
                t2 = time.perf_counter()
                compact_s, dict_s = compact_s + t1 - t0, dict_s + t2 - t1
                drafts += 1
                same += mine == theirs
    print(json.dumps({"store_tokens": filled, "keys": len(keys), "file_mb": round(size / 2**20, 1),
                      "build_s": round(built_s, 2), "map_s": round(loaded_s, 4),
                      "dictionaries_build_s": round(dictionaries_s, 2),
                      "positions": drafts, "same_draft": round(same / drafts, 4),
                      "draft_us_compact": round(compact_s / drafts * 1e6, 1),
                      "draft_us_dictionaries": round(dict_s / drafts * 1e6, 1)}, indent=1))


if __name__ == "__main__":
    main()
