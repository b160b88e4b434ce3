"""What a warm recycling table is worth: recycle:3 on the unseen prompts with a table that starts empty
(cold) against one filled first by recycle:3 runs over the 49 tuning prompts (warm, as a table carried
between runs would start), interleaved prompt by prompt with plain decoding, one process, greedy, 64
tokens. Run on an idle machine (../shared/tools/quiet-check); prints what
benchmarks/results/free-drafters/warm-table.txt keeps.

    python3 benchmarks/recycle_warm_table.py
"""

from __future__ import annotations

import json
import time

import torch

from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.decoding.drafters.recycle import RecycleDrafter
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt

TUNING = ["heldout-prompts", "bench-prompts", "random-prompts", "lossy-prompts"]


def prompts(name: str) -> list[str]:
    return [json.loads(line)["prompt"] for line in open(f"benchmarks/{name}.jsonl") if line.strip()]


def main() -> None:
    torch.set_num_threads(2)
    runtime = load_pair(load_registry(None).pair(None), drafting=False)
    vocab = runtime.target.model.config.get_text_config().vocab_size

    def engine(drafter):
        return SpeculativeEngine(runtime.target.model, drafter, runtime.eos_token_ids, runtime.block_plan)

    cold, warm, plain = engine(RecycleDrafter(vocab)), engine(RecycleDrafter(vocab)), engine(None)
    tuning = [p for name in TUNING for p in prompts(name)]
    started = time.perf_counter()
    for prompt in tuning:
        for _ in warm.generate(encode_prompt(runtime.tokenizer, prompt), k=3, max_new_tokens=64):
            pass
    filled = int((warm.drafter.table[:, 0] >= 0).sum())
    print(f"warmed on {len(tuning)} prompts in {time.perf_counter() - started:.1f} s; table filled: {filled} tokens")
    totals = {name: [0.0, 0, 0] for name in ("plain", "cold", "warm")}  # seconds, tokens, rounds
    same = True
    for prompt in prompts("unseen-prompts"):
        ids = encode_prompt(runtime.tokenizer, prompt)
        outputs = {}
        for name, run, k in (("plain", plain, 0), ("cold", cold, 3), ("warm", warm, 3)):
            started, tokens, rounds = time.perf_counter(), [], 0
            for event in run.generate(ids, k=k, max_new_tokens=64):
                tokens += event.emitted
                rounds += 1
            totals[name][0] += time.perf_counter() - started
            totals[name][1] += len(tokens)
            totals[name][2] += rounds
            outputs[name] = tokens
        same &= outputs["plain"] == outputs["cold"] == outputs["warm"]
    base = totals["plain"][1] / totals["plain"][0]
    for name, (seconds, tokens, rounds) in totals.items():
        print(f"{name}: {tokens / seconds:.1f} tok/s, x{tokens / seconds / base:.3f} plain, {tokens / rounds:.3f} tokens a round")
    print("every output plain's:", same)


if __name__ == "__main__":
    main()
