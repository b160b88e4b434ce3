"""A prompt's forward on the int4 kernels against dense weights (runtime/dense_prefill.py: bfloat16 or float32, by CPU;
made here even where this CPU's default keeps prompts on the kernels).

    OMP_NUM_THREADS=2 python3 benchmarks/prefill.py --prompts benchmarks/unseen-sample.jsonl

Both in one process on the same loaded target, alternating which goes first, the fastest of
``--repeats`` per prompt: the engine's prompt forward (every prompt token but the last, into an
empty cache), with the dense weights and with them switched off. Prints one line per prompt and
the totals; the greedy tokens that follow are not compared here (verify-equivalence does that).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("SPECDEC_DENSE_PREFILL", "1")  # the copies, also where prompts would stay on the kernels
    runtime = load_pair(load_registry().pair(None))
    lean = getattr(runtime.target.model.forward, "__self__", None)
    dense = getattr(lean, "prompt_layers", None)
    if dense is None:
        raise SystemExit("the default target runs no dense prompt forward here (not an int8/int4 Llama, "
                         "or SPECDEC_DENSE_PREFILL=0)")
    engine = SpeculativeEngine(runtime.target.model, None, runtime.eos_token_ids)
    rows = []
    with torch.inference_mode():
        for index, prompt in enumerate(read_file(args.prompts)):
            tokens = torch.tensor(encode_prompt(runtime.tokenizer, prompt.text), dtype=torch.long)
            seconds = {"int4 kernels": [], "dense": []}
            for repeat in range(args.repeats):
                order = list(seconds) if (index + repeat) % 2 == 0 else list(reversed(seconds))
                for name in order:
                    lean.prompt_layers = dense if name == "dense" else None
                    started = time.perf_counter()
                    engine.prompt_cache(tokens)
                    seconds[name].append(time.perf_counter() - started)
            lean.prompt_layers = dense
            rows.append({"prompt": prompt.id, "tokens": int(tokens.shape[0]),
                         **{name: round(1000 * min(times), 1) for name, times in seconds.items()}})
    for row in sorted(rows, key=lambda r: r["tokens"]):
        print(json.dumps(row))
    totals = {name: round(sum(r[name] for r in rows)) for name in ("int4 kernels", "dense")}
    print(json.dumps({"threads": torch.get_num_threads(), "prompts": len(rows), "total_ms": totals}))


if __name__ == "__main__":
    main()
