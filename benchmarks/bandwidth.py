"""How fast this machine reads memory, as a decoding token reads its weights: a stream of one large
buffer, summed (torch's reduction on every thread asked for), the fastest of a few passes. It is the
ceiling for a memory-bound forward's bytes per token: a target's plain decoding reads every weight
once a token, so its GB/s read (prepared weights' bytes × tokens/s) is compared against it.

Run it on a quiet machine (../shared/tools/quiet-check).

Usage: python3 benchmarks/bandwidth.py [--gib 1] [--threads 2] [--passes 7]
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def read_gb_per_s(gib: float, threads: int, passes: int) -> float:
    """The fastest pass's GB/s summing a ``gib`` GiB float32 buffer on ``threads`` threads."""
    torch.set_num_threads(threads)
    buffer = torch.ones(int(gib * 2**30) // 4)
    buffer.sum()  # pages touched once before timing
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--passes", type=int, default=7)
    args = parser.parse_args()
    print(json.dumps({"read_gb_per_s": round(read_gb_per_s(args.gib, args.threads, args.passes), 2),
                      "threads": args.threads, "gib": args.gib}))


if __name__ == "__main__":
    main()
