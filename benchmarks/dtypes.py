"""Plain and speculative decoding of one pair's target at several dtypes, interleaved prompt by prompt.

    python3 benchmarks/dtypes.py --prompts examples/equivalence-prompts.jsonl --max-new-tokens 64

For each dtype: plain tok/s, the pair's default speculative mode (`auto`, as `specdec generate`)
tok/s, whether its tokens equal plain decoding's at that dtype, the one-token forward time, and the
share of prompts whose greedy output differs from float32's (the first dtype given is the reference).
"""

from __future__ import annotations

import argparse
import json

import torch

from specdec_cli.decoding.runtime import prepare
from specdec_cli.measure import bench
from specdec_cli.pairs.registry import load_registry, override
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--pair")
    parser.add_argument("--dtypes", default="float32,bfloat16,int8,int4")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--limit", type=int, default=0, help="Use only the first N prompts.")
    args = parser.parse_args()
    dtypes = args.dtypes.split(",")
    pair = load_registry().pair(args.pair)
    items = read_file(args.prompts)[: args.limit or None]
    modes = [bench.Mode("plain"), bench.Mode("auto")]
    runners, encoded = {}, None
    for dtype in dtypes:
        runtime = prepare(override(pair, dtype=dtype))
        encoded = encoded or [encode_prompt(runtime.tokenizer, p.text) for p in items]
        b = bench.Bench(runtime, args.max_new_tokens)
        runners[dtype] = {mode: b.runner(mode) for mode in modes}
        for mode in modes:  # warm-up, then a fresh controller for auto
            runners[dtype][mode](encoded[0][:], items[0])
        runners[dtype][modes[1]] = b.runner(modes[1])
    samples = {(d, m): [] for d in dtypes for m in modes}
    for index, (item, ids) in enumerate(zip(items, encoded)):
        for dtype in dtypes[index % len(dtypes):] + dtypes[: index % len(dtypes)]:
            for mode in modes if index % 2 == 0 else modes[::-1]:
                samples[dtype, mode].append(runners[dtype][mode](ids, item))
    reference = [s.tokens for s in samples[dtypes[0], modes[0]]]
    result = {}
    for dtype in dtypes:
        plain, auto = samples[dtype, modes[0]], samples[dtype, modes[1]]
        tps = lambda ss: sum(len(s.tokens) for s in ss) / sum(s.wall_s for s in ss)  # noqa: E731
        result[dtype] = {
            "plain_tok_s": round(tps(plain), 2),
            "auto_tok_s": round(tps(auto), 2),
            "auto_identical_to_plain": all(a.tokens == p.tokens for a, p in zip(auto, plain)),
            "one_token_forward_ms": round(1000 * sum(s.verify_s for s in plain) / sum(s.rounds for s in plain), 2),
            f"differs_from_{dtypes[0]}": f"{sum(s.tokens != r for s, r in zip(plain, reference))}/{len(plain)}",
        }
    base = result[dtypes[0]]["plain_tok_s"]
    for figures in result.values():
        figures[f"plain_vs_{dtypes[0]}_plain"] = round(figures["plain_tok_s"] / base, 2)
    print(json.dumps({"prompts": len(items), "max_new_tokens": args.max_new_tokens, "threads": torch.get_num_threads(),
                      "dtypes": result}, indent=2))


if __name__ == "__main__":
    main()
