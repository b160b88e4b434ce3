"""What token recycling and the suffix memory add to a round, against a one-token forward of the
default target: the verify rows' top id, the table's update, both drafters' ready drafts, and the
memory's update when an answer finishes.

    python benchmarks/free_drafter_bookkeeping.py

Each step is timed over many repeats (median of 7 batches) on a context of 300 tokens, a memory of
40 answers of 64 tokens, and a verify block of 4 rows; the forward is the prepared int4 target's own
one-token step over the same context, on the kernels that run by default.
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from specdec_cli.decoding.drafters.base import Verified, top_ids
from specdec_cli.decoding.kv import crop_cache
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.decoding.drafters.recycle import RecycleDrafter
from specdec_cli.decoding.drafters.suffix import SuffixDrafter
from specdec_cli.pairs.registry import load_registry


def median_s(step, repeats: int = 200) -> float:
    batches = []
    for _ in range(7):
        started = time.perf_counter()
        for _ in range(repeats):
            step()
        batches.append((time.perf_counter() - started) / repeats)
    return statistics.median(batches)


@torch.inference_mode()
def main() -> None:
    runtime = load_pair(load_registry().pair(None), drafting=False)
    model, vocab = runtime.target.model, runtime.target.model.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(100, vocab, (300,), generator=generator)
    engine = runtime.engine
    cache, _ = engine.prompt_cache(context)
    length = context.shape[0] - 1

    def forward():
        model(context[None, -1:], cache=cache, use_cache=True, logits_to_keep=1)
        crop_cache(cache, length)

    logits = torch.randn(4, vocab, generator=generator)
    block = context[-4:]
    recycle, memory = RecycleDrafter(vocab), SuffixDrafter()
    answers = [torch.randint(100, 2000, (72,), generator=generator).tolist() for _ in range(40)]
    for answer in answers:
        memory.remember(answer, 8)
    successors = top_ids(logits, 1)
    verified = Verified(context, 200, block=block, successors=successors)
    recycle.observe(verified)
    recycle.table[:, 0] = torch.arange(vocab, dtype=torch.int32).roll(1)  # every walk runs its 8 steps
    finished = Verified(torch.tensor(answers[0]), 8, finished=True)
    forward_s = median_s(forward, 50)
    steps = {
        "top id of 4 rows (numpy argmax)": lambda: top_ids(logits, 1),
        "top 8 ids of 4 rows (torch.topk), for comparison": lambda: top_ids(logits, 8),
        "recycling's update": lambda: recycle.observe(verified),
        "recycling's draft (8 tokens at most)": lambda: recycle.propose(context, 8, None, None),
        "the memory's draft": lambda: memory.propose(context, 8, None, None),
        "the memory's update, once per answer": lambda: memory.observe(finished),
    }
    report = {"one_token_forward_ms": round(forward_s * 1e3, 3), "steps": {}}
    for name, step in steps.items():
        seconds = median_s(step, 20 if "update, once" in name else 200)
        report["steps"][name] = {"ms": round(seconds * 1e3, 4), "of_a_forward_pct": round(100 * seconds / forward_s, 2)}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
