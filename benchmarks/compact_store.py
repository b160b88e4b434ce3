"""Is a static store feasible as a file? The stored greedy answers (examples/answers/) as sorted
n-gram hashes with each one's likeliest successor and its share, against the suffix memory's
dictionaries holding the same answers: size, time to build and to load, time a draft takes, and
whether the two draft the same tokens on the unseen prompts' plain answers.

    python3 benchmarks/compact_store.py --tokens 600000

The file form is the store drafter's table (specdec_cli/decoding/drafters/store_file.py, which grew from this
script): per n-gram hash its likeliest successor (ties: the smallest id, where the memory keeps the
first seen) and that successor's share, as int32 and float32 (16 bits each would do for this vocabulary).
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
from specdec_cli.decoding.drafters.store_file import Table, build_table
from specdec_cli.decoding.drafters.suffix import MAX_MATCH, continuation
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="benchmarks/unseen-prompts.jsonl")
    parser.add_argument("--tokens", type=int, default=600_000, help="answer tokens in the store")
    parser.add_argument("--depth", type=int, default=4)
    args = parser.parse_args()
    stored = stored_answers(args.tokens)
    started = time.perf_counter()
    table = build_table(stored)
    built_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as directory:
        for name in ("keys", "successors", "shares"):
            np.save(Path(directory) / f"{name}.npy", getattr(table, name))
        size = sum(p.stat().st_size for p in Path(directory).iterdir())
        started = time.perf_counter()
        table = Table(*(np.load(Path(directory) / f"{name}.npy", mmap_mode="r") for name in ("keys", "successors", "shares")))
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
                mine = table.continuation(tail, args.depth)
                t1 = time.perf_counter()
                theirs = continuation(memory.counts, tail, args.depth)
                t2 = time.perf_counter()
                compact_s, dict_s = compact_s + t1 - t0, dict_s + t2 - t1
                drafts += 1
                same += mine == theirs
    print(json.dumps({"store_tokens": filled, "keys": len(table.keys), "file_mb": round(size / 2**20, 1),
                      "build_s": round(built_s, 2), "map_s": round(loaded_s, 4),
                      "dictionaries_build_s": round(dictionaries_s, 2),
                      "positions": drafts, "same_draft": round(same / drafts, 4),
                      "draft_us_compact": round(compact_s / drafts * 1e6, 1),
                      "draft_us_dictionaries": round(dict_s / drafts * 1e6, 1)}, indent=1))


if __name__ == "__main__":
    main()
