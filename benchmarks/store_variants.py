"""Which answers should a store hold? Stores built from different parts of examples/answers/, replayed
on the plain answers of prompts none of them answers (by default the tuning files, never the unseen
bench prompts), each round drafted as `-k auto` mostly drafts it: prompt lookup on a match of two or
more tokens, else the store, chains of at most --depth tokens, costs from this machine's block costs.

    python benchmarks/store_variants.py > variants.json
    python benchmarks/store_variants.py --rules > rules.json

Variants: the shipped store (greedy answers), greedy and sampled answers (temperature 0.8), and those
with the requests and follow-ups the target wrote as a user (its text too, not answers). With
--rules: the shipped answers drafted with other lengths (a multiple of the match, a floor on the
draft's estimated chance, a deeper chain). Untimed.
"""

from __future__ import annotations

import argparse
import json

import torch
from free_drafter_replay import block_cost, kept, walk
from static_store_replay import stored_answers

from specdec_cli.decoding.drafters.lookup import NgramDrafter
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.decoding.drafters.store_file import build_table
from specdec_cli.decoding.drafters.suffix import MAX_MATCH
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file

TUNING = ["examples/calibration-prompts.jsonl", "benchmarks/bench-prompts.jsonl", "benchmarks/random-prompts.jsonl",
          "examples/equivalence-prompts.jsonl", "benchmarks/lossy-prompts.jsonl"]
VARIANTS = {"greedy": {("answers", "greedy"), ("conversations", "greedy"), ("handwritten", "greedy")},
            "greedy+sampled": {("answers", "greedy"), ("conversations", "greedy"), ("handwritten", "greedy"),
                               ("answers", "sampled"), ("conversations", "sampled"), ("handwritten", "sampled")}}
VARIANTS["everything"] = VARIANTS["greedy+sampled"] | {("requests", "sampled"), ("followups", "sampled")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", nargs="+", default=TUNING)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rules", action="store_true", help="the shipped answers under other draft rules instead")
    args = parser.parse_args()
    runtime = load_pair(load_registry().pair(None))
    cost = block_cost(runtime)

    plain = SpeculativeEngine(runtime.target.model, None, runtime.eos_token_ids, runtime.block_plan)
    answers = []
    for prompt in (p for path in args.prompts for p in read_file(path)):
        ids = encode_prompt(runtime.tokenizer, prompt.text)
        answers.append((ids, [t for e in plain.generate(ids, k=0, max_new_tokens=args.max_new_tokens) for t in e.emitted]))
    report = {"prompts": args.prompts, "answers": len(answers), "variants": {}}
    if args.rules:  # (factor, floor, depth) over the shipped answers
        table = build_table(stored_answers(parts=VARIANTS["greedy"]))
        runs = {f"factor {f}, floor {p}, depth {d}": (table, f, p, d)
                for f, p, d in ((1, 0.1, 4), (1.5, 0.1, 4), (2, 0.1, 4), (1, 0.05, 4), (1, 0.2, 4), (1, 0.3, 4),
                                (1, 0.4, 4), (1, 0.5, 4), (2, 0.05, 6), (1, 0.1, 6))}
    else:
        runs = {"lookup alone": (None, 1, 0.1, args.depth),
                **{name: (build_table(stored_answers(parts=parts)), 1, 0.1, args.depth) for name, parts in VARIANTS.items()}}
    for name, (table, factor, floor, depth) in runs.items():
        rounds = spent = tokens = 0
        for ids, answer in answers:
            context, lookup = torch.tensor(ids + answer), NgramDrafter(max_ngram=3, min_ngram=1)
            at = []
            for step in range(len(ids), len(context)):
                found = lookup.propose(context[:step], depth, None, None)
                chain = found.tokens.tolist() if found.source in ("lookup", "lookup-2") else []
                if not chain and table is not None:
                    chain = table.continuation(context[max(step - MAX_MATCH, 0):step].tolist(), depth, factor, floor)[0]
                at.append((len(chain), kept(chain, context[step:].tolist())))
            r, c = walk(cost, len(answer), lambda position: at[position])
            rounds, spent, tokens = rounds + r, spent + c, tokens + len(answer)
        report["variants"][name] = {"keys": 0 if table is None else len(table.keys),
                                    "tokens_per_round": round(tokens / rounds, 3), "predicted_speedup": round(tokens / spent, 3)}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
