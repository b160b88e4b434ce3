"""Every prompt of a file as one job through the engine's own loop, `--batch` at once, timed in process
after a warm-up job: the loop without start-up, for comparing two checkouts. Run it from this tree with
PYTHONPATH at the checkout to time, alternating, each a fresh process:

    git worktree add /tmp/old REV
    for i in 1 2 3; do for tree in /tmp/old .; do
      PYTHONPATH=$tree OMP_NUM_THREADS=2 python3 benchmarks/loop_job.py --batch 16 --rounds 2
    done; done
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, default=Path("benchmarks/batch-jobs.jsonl"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--mode", default="plain", help="a bench mode: plain, auto, ngram:4, ...")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    import specdec_cli
    from specdec_cli.commands.common import resolve_pair
    from specdec_cli.decoding.loaded_pair import load_pair
    from specdec_cli.measure.batch_bench import run_job
    from specdec_cli.measure.loop_bench import Bench, parse_modes
    from specdec_cli.pairs.tokenization import encode_prompt
    from specdec_cli.prompts import read_file
    from specdec_cli.runtime import threads

    threads.apply(2)
    loaded = load_pair(resolve_pair(None, None, None, None, None, None))
    bench, mode = Bench(loaded, args.tokens), parse_modes(args.mode)[-1]
    items = read_file(args.prompts)
    encoded = [encode_prompt(loaded.tokenizer, item.text) for item in items]
    run_job(bench, mode, items[: args.batch], encoded[: args.batch], args.batch)  # warm-up
    found = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        run_job(bench, mode, items, encoded, args.batch)
        found.append(time.perf_counter() - started)
    where = Path(specdec_cli.__file__).resolve().parents[1]
    print(f"{where}: {mode} at batch {args.batch}: " + " ".join(f"{s:.2f}" for s in found) + " s", flush=True)


if __name__ == "__main__":
    main()
