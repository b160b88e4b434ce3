"""What a verify block of n tokens costs against one token, per dtype and kernel: the whole target
forward, and the weight-only linears alone on one layer's shapes (x30), so that the two can be told apart.

    python3 benchmarks/block_costs.py --dtypes int4,int8 --kernels torch,q8 --contexts 100,2000

The forward is ``blocks.time_blocks`` (the cost verify-block padding plans with) over a cached context;
``torch`` is torch's weight-only kernels (``aten._weight_int4pack_mm_for_cpu``,
``aten._weight_int8pack_mm``, one SDPA call per row), ``q8`` specdec's own (runtime/native_kernels.py:
int8 activation codes, its attention op). Each kernel is measured in a process of its own (the kernel
is chosen at load), the kernels interleaved over ``--rounds``; a figure is the fastest of all its
repeats, as ratios to one row. Set ``ATEN_CPU_CAPABILITY=avx2`` for the AVX2 path.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # fused q/k/v, o, fused gate/up, down


def kernel_costs(kind: str, native: bool, rows: int, reps: int = 5, layers: int = 30) -> dict[int, float]:
    import torch

    from specdec_cli.runtime.quantize import native_linear, quantised_weight

    torch.manual_seed(0)
    make = native_linear if native else quantised_weight
    linears = [make(torch.randn(out, inner), kind) for out, inner in SHAPES]
    times: dict[int, list[float]] = {n: [] for n in range(1, rows + 1)}
    for _ in range(reps + 1):
        for n in times:
            inputs = {inner: torch.randn(n, inner) for _, inner in SHAPES}
            started = time.perf_counter()
            for _ in range(layers):
                for (_, inner), linear in zip(SHAPES, linears):
                    linear(inputs[inner])
            times[n].append(time.perf_counter() - started)
    return {n: min(samples[1:]) for n, samples in times.items()}


def one_kernel(kernel: str, dtypes: list[str], contexts: list[int], rows: int, pair_name: str | None) -> None:
    """In this process: every dtype's forward and linears on ``kernel``, as one JSON line each."""
    from specdec_cli.decoding.blocks import time_blocks
    from specdec_cli.pairs.loading import load
    from specdec_cli.pairs.registry import load_registry, override
    from specdec_cli.runtime.rowwise_attention import on_native_kernels

    pair = load_registry(None).pair(pair_name)
    for dtype in dtypes:
        model = load(override(pair, dtype=dtype).target).model
        assert on_native_kernels(model) == (kernel == "q8"), f"asked for {kernel}, loaded the other"
        report = {f"forward_{context}": time_blocks(model, lengths=rows, reps=9, context=context)
                  for context in contexts}
        report["linears"] = kernel_costs(dtype, kernel == "q8", rows)
        print(json.dumps({"kernel": kernel, "dtype": dtype, **report}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="int4,int8")
    parser.add_argument("--kernels", default="torch,q8")
    parser.add_argument("--contexts", default="100,2000")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pair", default=None)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child process: this kernel only
    args = parser.parse_args()
    dtypes, contexts = args.dtypes.split(","), [int(c) for c in args.contexts.split(",")]
    if args.one:
        return one_kernel(args.one, dtypes, contexts, args.rows, args.pair)
    best: dict[tuple[str, str], dict[str, dict[int, float]]] = {}
    kernels = args.kernels.split(",")
    for round_ in range(args.rounds):
        for kernel in kernels if round_ % 2 == 0 else kernels[::-1]:
            env = {**os.environ, "SPECDEC_TORCH_KERNELS": "1" if kernel == "torch" else ""}
            child = [sys.executable, __file__, "--one", kernel, "--dtypes", args.dtypes, "--contexts", args.contexts,
                     "--rows", str(args.rows)] + (["--pair", args.pair] if args.pair else [])
            for line in subprocess.run(child, env=env, capture_output=True, text=True, check=True).stdout.splitlines():
                result = json.loads(line)
                kept = best.setdefault((result.pop("kernel"), result.pop("dtype")), {})
                for what, costs in result.items():
                    kept[what] = {n: min(s, kept.get(what, {}).get(n, s)) for n, s in costs.items()}
    import torch

    for (kernel, dtype), report in best.items():
        line = {"kernel": kernel, "dtype": dtype, "cpu_path": torch.backends.cpu.get_cpu_capability()}
        for what, costs in report.items():
            line[f"{what}_one_ms"] = round(costs["1"] * 1e3, 2)
            line[what] = {n: round(s / costs["1"], 2) for n, s in costs.items()}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
