"""The batch's attention in one op a layer (attend_cached) against each answer's cache updates in Python.

--probe: one layer's attention for B answers of 100 cached positions, SmolLM2's shapes, 30 layers a
forward, timed alone (and specdec's attention op alone). Otherwise: the default pair's plain (or
--mode) job on a prompt file at each batch size, in one process, switching the lean forward between
the two ways job by job (``cached_op``), interleaved; medians and each pair's ratio.

    OMP_NUM_THREADS=2 python3 benchmarks/batched_attention.py --probe --batch 16
    OMP_NUM_THREADS=2 python3 benchmarks/batched_attention.py --prompts benchmarks/batch-jobs.jsonl --batch 1,4,8,16 --rounds 4
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path


def probe(answers: int, layers: int = 30, rounds: int = 100) -> None:
    import torch

    from specdec_cli.pairs.cache_dir import cache_root
    from specdec_cli.runtime import native_kernels
    from specdec_cli.runtime.lean_decoder import LeanDecoder, Rows
    from specdec_cli.runtime.reserved_cache import ReservedCache
    from specdec_cli.runtime.rowwise_attention import causal_counts

    native_kernels.load(cache_root())

    class Shapes:  # SmolLM2-135M's attention
        num_attention_heads, num_key_value_heads, head_dim, hidden_size = 9, 3, 64, 576

    decoder = LeanDecoder(Shapes(), native=True)
    caches = [ReservedCache(layers) for _ in range(answers)]
    for cache in caches:
        for layer in range(layers):
            cache.update(torch.randn(1, 3, 100, 64), torch.randn(1, 3, 100, 64), layer)
    heads, cos, sin = torch.randn(answers, 15, 64), torch.randn(answers, 1, 64), torch.randn(answers, 1, 64)

    def forward(cached_op: bool) -> None:
        decoder.cached_op = cached_op
        parts = [Rows(1, cache) for cache in caches]
        for layer in range(layers):
            decoder.attention(heads, cos, sin, layer, parts)
        for cache in caches:
            cache.crop(-1)

    queries = [torch.randn(1, 9, 64) for _ in caches]
    keys, values = [torch.randn(3, 101, 64) for _ in caches], [torch.randn(3, 101, 64) for _ in caches]
    counts = [causal_counts(1, 101)] * answers
    for name, run in (("one op a layer", lambda: forward(True)), ("per-answer updates", lambda: forward(False)),
                      ("the attention op alone", lambda: [decoder.kernels.attend_rows(queries, keys, values, counts,
                                                                                       [None] * answers, 0.125)
                                                          for _ in range(layers)])):
        for _ in range(10):
            run()
        started = time.perf_counter()
        for _ in range(rounds):
            run()
        print(f"{name}: {(time.perf_counter() - started) / rounds * 1e3:.2f} ms a forward of {answers} answers")


def jobs(prompts: Path, sizes: list[int], rounds: int, tokens: int, mode_name: str) -> None:
    from specdec_cli.commands.common import resolve_pair
    from specdec_cli.decoding.loaded_pair import load_pair
    from specdec_cli.measure.batch_bench import run_job
    from specdec_cli.measure.loop_bench import Bench, Mode
    from specdec_cli.pairs.tokenization import encode_prompt
    from specdec_cli.prompts import read_file
    from specdec_cli.runtime import threads

    threads.apply(2)
    loaded = load_pair(resolve_pair(None, None, None, None, None, None))
    lean = loaded.target.model.forward.__self__
    bench, mode = Bench(loaded, tokens), Mode(mode_name)
    items = read_file(prompts)
    encoded = [encode_prompt(loaded.tokenizer, item.text) for item in items]
    for size in sizes:
        run_job(bench, mode, items[:size], encoded[:size], size)  # warm-up
        found: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(rounds):
            for cached_op in (True, False) if round_ % 2 == 0 else (False, True):
                lean.cached_op = cached_op
                started = time.perf_counter()
                run_job(bench, mode, items, encoded, size)
                found[cached_op].append(time.perf_counter() - started)
        lean.cached_op = True
        new, old = statistics.median(found[True]), statistics.median(found[False])
        pairs = " ".join(f"{o / n:.2f}" for n, o in zip(found[True], found[False]))
        print(f"batch {size}: one op a layer {new:.2f} s, per-answer updates {old:.2f} s (medians of {rounds}); "
              f"gain {old / new:.2f}x; each pair {pairs}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", action="store_true", help="time one forward's attention alone")
    parser.add_argument("--prompts", type=Path, default=Path("benchmarks/batch-jobs.jsonl"))
    parser.add_argument("--batch", default="1,4,8,16", help="batch sizes (the probe takes the first)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--mode", default="plain", help="a bench mode: plain, auto, ngram:4, ...")
    args = parser.parse_args()
    sizes = [int(size) for size in args.batch.split(",")]
    if args.probe:
        probe(sizes[0])
    else:
        jobs(args.prompts, sizes, args.rounds, args.tokens, args.mode)


if __name__ == "__main__":
    main()
