"""Plain and speculative decoding of one pair's target at several dtypes, interleaved prompt by prompt.

    python3 benchmarks/dtypes.py --prompts examples/equivalence-prompts.jsonl --max-new-tokens 64

For each dtype: plain tok/s, the pair's default speculative mode (`auto`, as `specdec generate`)
tok/s, whether its tokens equal plain decoding's at that dtype, the one-token forward time, the
share of prompts whose greedy output differs from float32's (the first dtype given is the reference),
and how close a one-token forward runs to the weight-bandwidth limit: the bytes of weights it streams
(every linear, the lm_head included; the embedding gives one row) over its time. ``--chart PNG``
draws the last two (matplotlib, a test extra).
"""

from __future__ import annotations

import argparse
import json

import torch
from torch import nn

from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.measure import loop_bench as bench
from specdec_cli.pairs.registry import load_registry, override
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file


def streamed_bytes(model: nn.Module) -> int:
    """Bytes of weights one token's forward reads: every parameter and buffer but the input
    embedding's (one row is gathered; a tied lm_head streams it whole, as the lm_head) and a
    quantised lm_head's float copy kept for draft heads."""
    embedding, seen, total = model.get_input_embeddings(), set(), 0
    for module in model.modules():
        if module is embedding:
            continue
        tensors = [t for name, t in module.named_parameters(recurse=False) if name != "float_weight"]
        for t in tensors + list(module.buffers(recurse=False)):
            if t is not None and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


def chart(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for dtype, figures in result.items():
        ax.scatter(figures["streamed_mb"], figures["one_token_forward_ms"], label=dtype)
    top = max(f["streamed_mb"] for f in result.values()) * 1.1
    best = max(f["effective_gb_s"] for f in result.values())
    ax.plot([0, top], [0, top / best], "k--", linewidth=0.8, label=f"{best:.1f} GB/s")
    ax.set_xlabel("weights streamed per token (MB)")
    ax.set_ylabel("one-token forward (ms)")
    ax.set_xlim(0, top)
    ax.set_ylim(0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--pair")
    parser.add_argument("--dtypes", default="float32,bfloat16,int8,int4")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--limit", type=int, default=0, help="Use only the first N prompts.")
    parser.add_argument("--chart", help="Also draw forward time against streamed bytes into this PNG.")
    args = parser.parse_args()
    dtypes = args.dtypes.split(",")
    pair = load_registry().pair(args.pair)
    items = read_file(args.prompts)[: args.limit or None]
    modes = [bench.Mode("plain"), bench.Mode("auto")]
    runners, encoded, streamed = {}, None, {}
    for dtype in dtypes:
        runtime = load_pair(override(pair, dtype=dtype))
        streamed[dtype] = streamed_bytes(runtime.target.model)
        encoded = encoded or [encode_prompt(runtime.tokenizer, p.text) for p in items]
        b = bench.Bench(runtime, args.max_new_tokens)
        runners[dtype] = {mode: b.runner(mode) for mode in modes}
        for mode in modes:  # warm-up, then a fresh controller for auto
            runners[dtype][mode](encoded[0][:], items[0], 0)
        runners[dtype][modes[1]] = b.runner(modes[1])
    samples = {(d, m): [] for d in dtypes for m in modes}
    for index, (item, ids) in enumerate(zip(items, encoded)):
        for dtype in dtypes[index % len(dtypes):] + dtypes[: index % len(dtypes)]:
            for mode in modes if index % 2 == 0 else modes[::-1]:
                samples[dtype, mode].append(runners[dtype][mode](ids, item, 0))
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
            "streamed_mb": round(streamed[dtype] / 1e6, 1),
        }
        result[dtype]["effective_gb_s"] = round(streamed[dtype] / 1e6 / result[dtype]["one_token_forward_ms"], 2)
    base = result[dtypes[0]]["plain_tok_s"]
    for figures in result.values():
        figures[f"plain_vs_{dtypes[0]}_plain"] = round(figures["plain_tok_s"] / base, 2)
    print(json.dumps({"prompts": len(items), "max_new_tokens": args.max_new_tokens, "threads": torch.get_num_threads(),
                      "dtypes": result}, indent=2))
    if args.chart:
        chart(result, args.chart)


if __name__ == "__main__":
    main()
