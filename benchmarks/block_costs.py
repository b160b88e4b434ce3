"""What a verify block of n tokens costs against one token, per dtype: the whole target forward, and
the weight-only kernels alone on one layer's shapes (x30), so that the two can be told apart.

    python3 benchmarks/block_costs.py --dtypes int4,int8,float32

The forward is ``blocks.measure`` (the cost verify-block padding plans with) over a 100-token cache;
the kernels are ``aten._weight_int4pack_mm_for_cpu`` and ``aten._weight_int8pack_mm`` on random
weights of SmolLM2-135M's layer shapes. Both are medians of interleaved repeats, as ratios to one
row. The finding they were written for: both kernels step up every 4 rows (they tile the rows by 4
and unpack the whole weight again for each tile), so a block of 5 costs about two of 4.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specdec_cli.decoding.blocks import measure
from specdec_cli.pairs.loading import load
from specdec_cli.runtime.quantize import QUANTISED, quantised_weight
from specdec_cli.pairs.registry import load_registry, override

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # fused q/k/v, o, fused gate/up, down


def kernel_costs(kind: str, rows: int, reps: int = 5, layers: int = 30) -> dict[int, float]:
    torch.manual_seed(0)
    linears = [quantised_weight(torch.randn(out, inner), kind) for out, inner in SHAPES]
    times: dict[int, list[float]] = {n: [] for n in range(1, rows + 1)}
    for _ in range(reps + 1):
        for n in times:
            inputs = {inner: torch.randn(n, inner) for _, inner in SHAPES}
            started = time.perf_counter()
            for _ in range(layers):
                for (_, inner), linear in zip(SHAPES, linears):
                    linear(inputs[inner])
            times[n].append(time.perf_counter() - started)
    return {n: sorted(samples[1:])[reps // 2] for n, samples in times.items()}


def ratios(costs: dict[int, float]) -> dict[int, float]:
    return {n: round(seconds / costs[1], 2) for n, seconds in costs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="int4,int8,float32")
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--pair", default=None)
    args = parser.parse_args()
    pair = load_registry(None).pair(args.pair)
    for dtype in args.dtypes.split(","):
        model = load(override(pair, dtype=dtype).target).model
        forward = measure(model, lengths=args.rows, reps=9, context=100)
        report = {"one_token_ms": round(forward[1] * 1e3, 1), "forward": ratios(forward)}
        if dtype in QUANTISED:
            kernels = kernel_costs(dtype, args.rows)
            report |= {"kernels_one_row_ms": round(kernels[1] * 1e3, 2), "kernels": ratios(kernels)}
        print(json.dumps({dtype: report}), flush=True)


if __name__ == "__main__":
    main()
