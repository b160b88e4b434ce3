"""A suffix memory filled beforehand with the target's stored answers (a static store, as llama.cpp's
ngram-cache keeps a static tier), replayed on the unseen prompts' plain answers.

    python benchmarks/static_store_replay.py --tokens 150000 > static-store-replay.json

The store is the greedy answers in examples/answers/ (the head's training data: the target's own
answers to the project's prompts, none of them a bench prompt), up to --tokens answer tokens,
indexed as the suffix memory indexes a finished answer. Rounds are walked as free_drafter_replay.py
walks them (chains of 4, drafting free, costs from the block-cost cache): prompt lookup alone, the
store alone, lookup on a match of two or more else the store (on any match, or on four tokens or
more), and the better of lookup and the store each round (an oracle). It also counts how often the
store's first token is the target's next, by the length of the match it continues.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json

import torch
from free_drafter_replay import block_cost, kept, walk

from specdec_cli.decoding.drafters.lookup import NgramDrafter
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.decoding.drafters.suffix import MAX_MATCH, SuffixDrafter, count
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file

POLICIES = ("lookup", "store", "lookup2_else_store", "lookup2_else_store4", "oracle")


def stored_answers(limit: int | None = None, parts: set[tuple[str, str]] | None = None) -> list[tuple[list[int], int]]:
    """The stored answers of these (directory, kind) parts of examples/answers/ (by default every greedy
    one), up to ``limit`` answer tokens: each as its tokens from MAX_MATCH before the answer on, and how
    many of them lead into it (as the memory remembers an answer)."""
    found, filled = [], 0
    for path in sorted(glob.glob("examples/answers/*/*.jsonl.gz")):
        directory = path.split("/")[-2]
        for line in gzip.open(path, "rt"):
            record = json.loads(line)
            wanted = record.get("kind") == "greedy" if parts is None else (directory, record.get("kind")) in parts
            if not wanted or (limit is not None and filled >= limit):
                continue
            ids, start = record["ids"], record.get("start", 0)
            lead = max(start - MAX_MATCH, 0)
            found.append((ids[lead:], start - lead))
            filled += len(ids) - start
    return found


def filled_store(limit: int) -> tuple[SuffixDrafter, int]:
    """A suffix memory holding the stored greedy answers, up to ``limit`` answer tokens, never forgotten."""
    store, filled = SuffixDrafter(memory_tokens=0), 0
    for tokens, lead in stored_answers(limit):
        count(store.counts, tokens, lead, 1)
        filled += len(tokens) - lead
    return store, filled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="benchmarks/unseen-prompts.jsonl")
    parser.add_argument("--tokens", type=int, default=150_000, help="answer tokens in the store")
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    runtime = load_pair(load_registry().pair(None))
    cost = block_cost(runtime)

    store, filled = filled_store(args.tokens)
    plain = SpeculativeEngine(runtime.target.model, None, runtime.eos_token_ids, runtime.block_plan)
    totals = {name: [0, 0.0] for name in POLICIES}
    tokens_total, first = 0, collections.defaultdict(lambda: [0, 0])
    for prompt in read_file(args.prompts):
        ids = encode_prompt(runtime.tokenizer, prompt.text)
        answer = [t for e in plain.generate(ids, k=0, max_new_tokens=args.max_new_tokens) for t in e.emitted]
        context = torch.tensor(ids + answer)
        lookup = NgramDrafter(max_ngram=3, min_ngram=1)
        rounds_at = []
        for step in range(len(ids), len(context)):
            here, truth = context[:step], context[step:].tolist()
            found = lookup.propose(here, args.depth, None, None)
            match = 3 if found.source == "lookup" else int(found.source[-1]) if found.source else 0
            offered = store.propose(here, args.depth, None, None)
            chains = {"lookup": found.tokens.tolist(), "store": offered.tokens.tolist()}
            if chains["store"]:
                first[offered.source][0] += chains["store"][0] == truth[0]
                first[offered.source][1] += 1
            got = {name: (len(chain), kept(chain, truth)) for name, chain in chains.items()}
            either = chains["lookup"] if match >= 2 else chains["store"]
            got["lookup2_else_store"] = (len(either), kept(either, truth))
            either = chains["lookup"] if match >= 2 else chains["store"] if offered.source == "suffix" else []
            got["lookup2_else_store4"] = (len(either), kept(either, truth))
            best = max(chains, key=lambda name: (got[name][1], -got[name][0]))
            got["oracle"] = got[best] if got[best][1] else (0, 0)
            rounds_at.append(got)
        for name in POLICIES:
            rounds, spent = walk(cost, len(answer), lambda position: rounds_at[position][name])
            totals[name][0] += rounds
            totals[name][1] += spent
        tokens_total += len(answer)
    print(json.dumps({"prompts": args.prompts, "store_tokens": filled, "store_keys": len(store.counts),
                      "tokens": tokens_total, "policies": {
                          name: {"tokens_per_round": round(tokens_total / rounds, 3),
                                 "predicted_speedup": round(tokens_total / spent, 3)}
                          for name, (rounds, spent) in totals.items()},
                      "store_first_token_kept": {source: {"drafts": n, "kept": round(hits / n, 3)}
                                                 for source, (hits, n) in sorted(first.items())}}, indent=1))


if __name__ == "__main__":
    main()
