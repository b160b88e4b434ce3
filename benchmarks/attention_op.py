"""specdec's attention op alone (native/attention_rows.cpp), on SmolLM2-135M's shapes (9 heads, 3 kv
heads, head_dim 64), in the cases a job calls it for: prompts' rows attending row by row (their first
128 positions), verify blocks, and a batch's single rows on caches too big for L3 (every layer its own
buffers). Run it once per checkout, alternating, each a fresh process (the library is built per source):

    for i in 1 2; do for tree in /tmp/old .; do
      PYTHONPATH=$tree OMP_NUM_THREADS=2 python3 benchmarks/attention_op.py
    done; done

Each line: the case, microseconds a call (best of --rounds), and a digest of its output, which two
checkouts that compute the same bits print alike.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path

CASES = {  # name: (answers, rows an answer, cached positions, layers of buffers)
    "prompts 16 x 116 rows": (16, 116, 0, 1),
    "prompt 1 x 116 rows": (1, 116, 0, 1),
    "verify 16 x 5 rows over 160": (16, 5, 160, 1),
    "verify 1 x 9 rows over 300": (1, 9, 300, 1),
    "batch 16 x 1 row over 165, 30 layers": (16, 1, 165, 30),
    "one token over 165, 30 layers": (1, 1, 165, 30),
}


def positive(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"{text} is not between 1 and 1000")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=positive, default=5)
    parser.add_argument("--calls", type=positive, default=20, help="calls a round (each layer's buffers once a call)")
    args = parser.parse_args()

    import torch

    import specdec_cli
    from specdec_cli.pairs.cache_dir import cache_root
    from specdec_cli.runtime import native_kernels
    from specdec_cli.runtime.rowwise_attention import causal_counts

    native_kernels.load(cache_root())
    kernels = native_kernels.bound()
    print(Path(specdec_cli.__file__).resolve().parents[1], flush=True)
    for name, (answers, rows, cached, layers) in CASES.items():
        g = torch.Generator().manual_seed(0)
        keys = [[torch.randn(3, cached + rows, 64, generator=g) for _ in range(answers)] for _ in range(layers)]
        values = [[torch.randn(3, cached + rows, 64, generator=g) for _ in range(answers)] for _ in range(layers)]
        queries = [torch.randn(rows, 9, 64, generator=g) for _ in range(answers)]
        counts = [causal_counts(rows, cached + rows)] * answers
        out = None

        def call():
            nonlocal out
            for layer in range(layers):
                out = kernels.attend_rows(queries, keys[layer], values[layer], counts, [None] * answers, 0.125)

        call()
        best = float("inf")
        for _ in range(args.rounds):
            started = time.perf_counter()
            for _ in range(args.calls):
                call()
            best = min(best, (time.perf_counter() - started) / (args.calls * layers))
        digest = hashlib.sha256(out.numpy().tobytes()).hexdigest()[:12]
        print(f"{name:40s} {best * 1e6:9.1f} us  {digest}", flush=True)


if __name__ == "__main__":
    main()
