"""transformers' cache layer (concatenating) against the reserved one (decoding/kv.py), one process.

    OMP_NUM_THREADS=2 python3 benchmarks/kv_cache.py --contexts 40,300,800
    OMP_NUM_THREADS=2 python3 benchmarks/kv_cache.py --prompts FILE.jsonl   # plain decoding end to end

With ``--contexts``: one-token forwards of the pair's target (default dtype) after a random prompt
of each length, medians of ``--steps`` forwards, the two caches alternating for ``--rounds``. With
``--prompts``: plain decoding (the engine at K = 0) of every prompt with each cache, alternating
prompt by prompt for 2 passes; the tokens must be equal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import DynamicCache

from specdec_cli.decoding import engine as engine_module
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.kv import reserved_cache
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file

CACHES = {"transformers": lambda config: DynamicCache(config=config), "reserved": reserved_cache}


@torch.inference_mode()
def forward_ms(model, ids, make, steps: int) -> float:
    cache = make(model.config)
    model(ids, cache=cache, use_cache=True, logits_to_keep=1)
    token, times = ids[:, -1:], []
    for _ in range(steps):
        started = time.perf_counter()
        token = model(token, cache=cache, use_cache=True, logits_to_keep=1).logits[:, -1:].argmax(-1)
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def decode(engine, ids, max_new_tokens: int) -> tuple[float, list[int]]:
    started, tokens = time.perf_counter(), []
    for event in engine.generate(ids, k=0, max_new_tokens=max_new_tokens):
        tokens += event.emitted
    return time.perf_counter() - started, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="40,300,800")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    runtime = load_pair(load_registry().pair(None))
    model = runtime.target.model
    if not args.prompts:
        for context in (int(c) for c in args.contexts.split(",")):
            ids = torch.randint(1000, (1, context), generator=torch.Generator().manual_seed(0))
            ms = {name: [] for name in CACHES}
            for _ in range(args.rounds):
                for name, make in CACHES.items():
                    ms[name].append(forward_ms(model, ids, make, args.steps))
            ratio = statistics.median(r / t for r, t in zip(ms["reserved"], ms["transformers"]))
            print(json.dumps({"context": context, **{f"{k}_ms": round(statistics.median(v), 2) for k, v in ms.items()},
                              "reserved_over_transformers": round(ratio, 3)}))
        return
    plain = SpeculativeEngine(model, None, runtime.eos_token_ids, runtime.block_plan)
    prompts = [encode_prompt(runtime.tokenizer, p.text) for p in read_file(args.prompts)]
    totals = {name: [0.0, 0] for name in CACHES}
    for repeat in range(2):
        for index, ids in enumerate(prompts):
            outputs = {}
            for name in (list(CACHES) if (index + repeat) % 2 == 0 else list(CACHES)[::-1]):
                engine_module.reserved_cache = CACHES[name]  # the engine's target cache
                seconds, outputs[name] = decode(plain, ids, args.max_new_tokens)
                totals[name][0] += seconds
                totals[name][1] += len(outputs[name])
            assert outputs["transformers"] == outputs["reserved"], f"prompt {index}: the caches gave different tokens"
    engine_module.reserved_cache = reserved_cache
    print(json.dumps({name: round(tokens / seconds, 2) for name, (seconds, tokens) in totals.items()} | {"unit": "tok/s"}))


if __name__ == "__main__":
    main()
