"""Prompt lookup's acceptance by draft position and match length, replayed on the default target's
plain answers: where the adaptive controller's lookup estimates start (decoding/control/priors.py).

    python benchmarks/lookup_priors.py --prompts examples/calibration-prompts.jsonl benchmarks/bench-prompts.jsonl \
        benchmarks/random-prompts.jsonl examples/equivalence-prompts.jsonl benchmarks/lossy-prompts.jsonl \
        benchmarks/heldout-prompts.jsonl

Greedy plain decoding gives each prompt's answer; then at every step where prompt lookup (the
offer the controller sees: n-grams of 3 down to 1 tokens) has a match, its draft is compared with
what the target wrote next. Per source (``drafters.lookup_source``), the chance draft i is kept
given those before were. Untimed. Never run it on benchmarks/unseen-prompts.jsonl: its figures
seed the controller that the bench measures.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch

from specdec_cli.decoding.drafters import NgramDrafter
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file


def replay(prompt: list[int], answer: list[int], k: int, kept: dict, judged: dict) -> None:
    """Count, at each step of ``answer`` where lookup finds a match, how far its draft agrees."""
    offer = NgramDrafter(max_ngram=3, min_ngram=1)
    tokens = torch.tensor(prompt + answer)
    for step in range(len(prompt), len(tokens)):
        draft = offer.propose(tokens[:step], k, None, None)
        truth = tokens[step : step + len(draft)].tolist()
        for i, token in enumerate(draft.tokens.tolist()[: len(truth)]):
            judged[draft.source][i] += 1
            if token != truth[i]:
                break
            kept[draft.source][i] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", nargs="+", required=True)
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    runtime = load_pair(load_registry().pair(None))
    plain = SpeculativeEngine(runtime.target.model, None, runtime.eos_token_ids, runtime.block_plan)
    kept, judged = defaultdict(lambda: [0] * args.k), defaultdict(lambda: [0] * args.k)
    prompts = [p for path in args.prompts for p in read_file(path)]
    for prompt in prompts:
        ids = encode_prompt(runtime.tokenizer, prompt.text)
        answer = [t for event in plain.generate(ids, k=0, max_new_tokens=args.max_new_tokens) for t in event.emitted]
        replay(ids, answer, args.k, kept, judged)
    print(json.dumps({"prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "sources": {
        source: {"matches": judged[source][0], "by_position": [round(h / n, 2) if n else None for h, n in zip(kept[source], judged[source])]}
        for source in sorted(judged)}}))


if __name__ == "__main__":
    main()
