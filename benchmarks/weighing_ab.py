"""A batch's steps weighing drafts only where that was seen to pay (control/batch_rows.Weighing) against
every step weighing them (as before it), and plain decoding, in one process, alternating: every prompt
of a file as one job through the engine's own loop, `--batch` at once, after a warm-up job.

    OMP_NUM_THREADS=2 python3 benchmarks/weighing_ab.py --prompts benchmarks/unseen-prompts.jsonl --tokens 128
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, default=Path("benchmarks/unseen-prompts.jsonl"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from specdec_cli.commands.common import resolve_pair
    from specdec_cli.decoding.control.batch_rows import Weighing
    from specdec_cli.decoding.loaded_pair import load_pair
    from specdec_cli.measure.batch_bench import run_job
    from specdec_cli.measure.loop_bench import Bench, parse_modes
    from specdec_cli.pairs.tokenization import encode_prompt
    from specdec_cli.prompts import read_file
    from specdec_cli.runtime import threads

    threads.apply(2)
    loaded = load_pair(resolve_pair(None, None, None, None, None, None))
    bench = Bench(loaded, args.tokens)
    auto, plain = parse_modes("auto")[-1], parse_modes("plain")[-1]
    items = read_file(args.prompts)
    encoded = [encode_prompt(loaded.tokenizer, item.text) for item in items]
    run_job(bench, auto, items[: args.batch], encoded[: args.batch], args.batch)  # warm-up
    weighs = Weighing.weighs
    arms = {"auto, Weighing": (auto, weighs), "auto, every step weighing": (auto, lambda self, size: True),
            "plain": (plain, weighs)}
    print("round\tarm\tjob_s\tdrafted\taccepted", flush=True)
    for round_ in range(1, args.rounds + 1):
        for name, (mode, chooser) in arms.items():
            Weighing.weighs = chooser
            started = time.perf_counter()
            job = run_job(bench, mode, items, encoded, args.batch)
            print(f"{round_}\t{name}\t{time.perf_counter() - started:.2f}\t{job.drafted}\t{job.accepted}", flush=True)
    Weighing.weighs = weighs


if __name__ == "__main__":
    main()
