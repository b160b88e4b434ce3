"""Where a one-token forward of a pair's target spends its time: torch.profiler's op table, grouped.

    OMP_NUM_THREADS=2 python3 benchmarks/forward_profile.py --dtype int4
    OMP_NUM_THREADS=2 python3 benchmarks/forward_profile.py --dtype int4 --compare 3   # lean vs transformers
    OMP_NUM_THREADS=2 python3 benchmarks/forward_profile.py --rows 1,4 --context 100,1000  # verify blocks

Runs greedy one-token forwards the way plain decoding does (a DynamicCache, one token a call) after
a short prompt, times them plainly, then profiles a second run and sums the ops' own CPU time per
group: the weight-only matmuls (by layer role), the attention kernel, cache concatenation,
element-wise ops (norms, rotary, SiLU), and what no op accounts for (Python and module dispatch).

With ``--rows``, forwards of verify blocks instead: each block of that many tokens after ``--context``
cached tokens (the engine's reserved cache, cropped back after each block, as a rejected round is),
so that what a block's extra rows cost can be told apart by op.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch
from transformers import DynamicCache

from specdec_cli.decoding.kv import crop_cache, reserved_cache
from specdec_cli.pairs.loading import load
from specdec_cli.pairs.registry import load_registry, override
from specdec_cli.runtime.lean_forward import LeanLlama

PROMPT = "Explain in a few sentences why the sky is blue, and what changes at sunset."
GROUPS = {  # aten op -> group; anything else is "other ops"
    "aten::_weight_int4pack_mm_for_cpu": "weight-only matmuls",
    "aten::_weight_int8pack_mm": "weight-only matmuls",
    "aten::mm": "float matmuls", "aten::addmm": "float matmuls", "aten::linear": "float matmuls",
    "aten::matmul": "float matmuls", "aten::bmm": "float matmuls",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention kernel",
    "aten::_scaled_dot_product_attention_math": "attention kernel",
    "specdec::q8_matmul": "weight-only matmuls", "specdec::attend_rows": "attention kernel",
    "aten::cat": "cache concatenation and cat",
    "aten::copy_": "dtype casts and copies", "aten::to": "dtype casts and copies", "aten::_to_copy": "dtype casts and copies",
    "aten::contiguous": "dtype casts and copies", "aten::clone": "dtype casts and copies",
    "aten::mul": "element-wise", "aten::add": "element-wise", "aten::pow": "element-wise", "aten::mean": "element-wise",
    "aten::rsqrt": "element-wise", "aten::silu": "element-wise", "aten::neg": "element-wise", "aten::cos": "element-wise",
    "aten::sin": "element-wise", "aten::div": "element-wise", "aten::sub": "element-wise",
}


def decode(model, ids, steps):
    """``steps`` greedy one-token forwards after the prompt; seconds per forward."""
    cache = DynamicCache(config=model.config)
    out = model(ids[:, :-1], cache=cache, use_cache=True, logits_to_keep=1)
    token, times = ids[:, -1:], []
    for _ in range(steps):
        started = time.perf_counter()
        out = model(token, cache=cache, use_cache=True, logits_to_keep=1)
        token = out.logits[:, -1:].argmax(-1)
        times.append(time.perf_counter() - started)
    return times


def prefilled(model, ids):
    """A reserved cache (the engine's) of every prompt token but the last, and its length."""
    cache = reserved_cache(model.config)
    model(ids[:, :-1], cache=cache, use_cache=True, logits_to_keep=1)
    return cache, cache.get_seq_length()


def blocks(model, cache, cached, block, steps):
    """``steps`` forwards of ``block`` after the ``cached`` tokens, each cropped off again as a
    rejected round is; seconds per forward. The same block each time, so every forward does the same work."""
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        model(block, cache=cache, use_cache=True, logits_to_keep=block.shape[1])
        times.append(time.perf_counter() - started)
        crop_cache(cache, cached)
    return times


def profiled(run, steps, shapes: bool = False):
    """Milliseconds per forward of ``run(steps)`` by op group, with what no op accounts for, and the profile."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=shapes) as prof:
        wall = 1000 * sum(run(steps)) / steps
    groups = defaultdict(float)
    for event in prof.key_averages():
        if event.key.startswith("aten::") or event.key.startswith("specdec"):
            groups[GROUPS.get(event.key, "other ops")] += event.self_cpu_time_total / 1000 / steps
    groups["Python and dispatch (no op)"] = wall - sum(groups.values())
    return {"profiled_forward_ms": round(wall, 3),
            "per_forward_ms": {k: round(v, 3) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])}}, prof


def verify_blocks(model, tokenizer, row_counts, contexts, steps):
    """Per context and block size: the median forward, unprofiled, and a profiled run's op groups."""
    text = " ".join([PROMPT] * (max(contexts) // 10 + 1))
    report = {}
    for context in contexts:
        ids = tokenizer(text, return_tensors="pt").input_ids[:, : context + 1]
        cache, cached = prefilled(model, ids)
        for rows in row_counts:
            block = ids[:, -1:].repeat(1, rows)
            blocks(model, cache, cached, block, 8)  # warm-up
            times = sorted(blocks(model, cache, cached, block, steps))
            groups, _ = profiled(lambda n: blocks(model, cache, cached, block, n), steps)
            report[f"context {context}, rows {rows}"] = {"forward_ms_median": round(1000 * times[len(times) // 2], 3), **groups}
    return report


def decode_tokens(model, ids, steps):
    """(greedy tokens, seconds per forward) of ``steps`` one-token forwards after the prompt."""
    cache = DynamicCache(config=model.config)
    model(ids[:, :-1], cache=cache, use_cache=True, logits_to_keep=1)
    token, tokens, times = ids[:, -1:], [], []
    for _ in range(steps):
        started = time.perf_counter()
        token = model(token, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1:].argmax(-1)
        times.append(time.perf_counter() - started)
        tokens.append(int(token))
    return tokens, times


def compare(model, ids, steps, rounds):
    """A/B/A/B: the model's own (lean, where installed) forward against transformers' class forward."""
    original = model.forward
    lean = LeanLlama(model).forward  # whether or not the loader installed one (SPECDEC_LEAN_FORWARD)
    forwards = {"transformers": type(model).forward.__get__(model), "lean": lean}
    medians, tokens = {name: [] for name in forwards}, {}
    with torch.inference_mode():
        for _ in range(rounds):
            for name, forward in forwards.items():
                model.forward = forward
                decode_tokens(model, ids, 4)  # warm-up
                tokens[name], times = decode_tokens(model, ids, steps)
                medians[name].append(1000 * sorted(times)[len(times) // 2])
    model.forward = original
    print(json.dumps({"threads": torch.get_num_threads(), "steps": steps,
                      "forward_ms_median": {k: [round(v, 3) for v in vs] for k, vs in medians.items()},
                      "same_tokens": tokens["lean"] == tokens["transformers"]}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair")
    parser.add_argument("--dtype", default="int4")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--table", type=int, default=0, help="Also print the profiler's top N ops.")
    parser.add_argument("--compare", type=int, default=0, metavar="N",
                        help="Instead: N interleaved rounds of transformers' forward against the lean one.")
    parser.add_argument("--rows", help="Instead: verify blocks of these sizes, comma-separated (1,4).")
    parser.add_argument("--context", default="100", help="With --rows: cached tokens before a block, comma-separated.")
    args = parser.parse_args()
    pair = override(load_registry().pair(args.pair), dtype=args.dtype)
    loaded = load(pair.target)
    model, ids = loaded.model, loaded.tokenizer(PROMPT, return_tensors="pt").input_ids
    if args.compare:
        return compare(model, ids, args.steps, args.compare)
    with torch.inference_mode():
        if args.rows:
            report = verify_blocks(model, loaded.tokenizer, [int(n) for n in args.rows.split(",")],
                                   [int(n) for n in args.context.split(",")], args.steps)
            print(json.dumps({"dtype": args.dtype, "threads": torch.get_num_threads(), "steps": args.steps, **report}, indent=2))
            return
        decode(model, ids, 8)  # warm-up
        times = sorted(decode(model, ids, args.steps))
        groups, prof = profiled(lambda n: decode(model, ids, n), args.steps, shapes=bool(args.table))
    print(json.dumps({
        "dtype": args.dtype, "threads": torch.get_num_threads(), "steps": args.steps,
        "forward_ms_median": round(1000 * times[len(times) // 2], 3),
        "forward_ms_min": round(1000 * times[0], 3), **groups,
    }, indent=2))
    if args.table:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.table))
        by_shape = prof.key_averages(group_by_input_shape=True)
        print(by_shape.table(sort_by="self_cpu_time_total", row_limit=args.table))


if __name__ == "__main__":
    main()
