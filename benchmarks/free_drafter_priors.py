"""The free drafters' acceptance by draft position and source, replayed on the default target's plain
answers: where the adaptive controller's estimates of them start (decoding/control/priors.py,
FREE_RATES): prompt lookup by match length, token recycling by how many times in a row its first
guess was the target's choice, the suffix memory and the pair's store by match length.

    python benchmarks/free_drafter_priors.py --prompts examples/calibration-prompts.jsonl benchmarks/bench-prompts.jsonl \
        benchmarks/random-prompts.jsonl examples/equivalence-prompts.jsonl benchmarks/lossy-prompts.jsonl \
        benchmarks/heldout-prompts.jsonl

The store's rates come from a run without benchmarks/heldout-prompts.jsonl: the store holds the
target's answers to those prompts (they are held out from the head's training, not from the answers).

Greedy plain decoding gives each prompt's answer, the prompts in the order given, as one process
sees them. At every step each drafter proposes from the context so far (lookup: n-grams of 3 down to
1 tokens, the offer the controller sees; recycling's table fed with every position the target
confirmed; the memory with the earlier answers), tagged as it tags its drafts, and its draft is
compared with what the target wrote next: per source, the chance draft i is kept given those before
were. Untimed. Never run it on benchmarks/unseen-prompts.jsonl: its figures seed the controller
that the bench measures.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch

from specdec_cli.decoding.drafters.base import Verified
from specdec_cli.decoding.drafters.lookup import NgramDrafter
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.decoding.drafters.recycle import RecycleDrafter
from specdec_cli.decoding.drafters.store import StoreDrafter
from specdec_cli.decoding.drafters.suffix import MAX_MATCH, SuffixDrafter
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file


def judge(draft, truth: list[int], kept: dict, judged: dict) -> None:
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
    vocab = runtime.target.model.config.get_text_config().vocab_size
    recycle, memory = RecycleDrafter(vocab), SuffixDrafter()
    store = runtime.pair.alternate("store")
    others = (recycle, memory, *([StoreDrafter.for_pair(store, vocab)] if store else []))
    kept, judged = defaultdict(lambda: [0] * args.k), defaultdict(lambda: [0] * args.k)
    prompts = [p for path in args.prompts for p in read_file(path)]
    for prompt in prompts:
        ids = encode_prompt(runtime.tokenizer, prompt.text)
        answer = [t for event in plain.generate(ids, k=0, max_new_tokens=args.max_new_tokens) for t in event.emitted]
        tokens = torch.tensor(ids + answer)
        lookup = NgramDrafter(max_ngram=3, min_ngram=1)
        for step in range(len(ids), len(tokens)):
            truth = tokens[step : step + args.k].tolist()
            for drafter in (lookup, *others):
                draft = drafter.propose(tokens[:step], args.k, None, None)
                if len(draft):
                    judge(draft, truth, kept, judged)
            # the row of the last token: the target's choice after it, as a verify round shows it
            recycle.observe(Verified(tokens[: step + 1], len(ids), block=tokens[step - 1 : step],
                                     successors=tokens[step : step + 1, None]))
        memory.observe(Verified(tokens, len(ids), finished=True))
    print(json.dumps({"prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "lead": MAX_MATCH, "sources": {
        source: {"drafts": judged[source][0],
                 "by_position": [round(h / n, 2) if n else None for h, n in zip(kept[source], judged[source])]}
        for source in sorted(judged)}}, indent=1))


if __name__ == "__main__":
    main()
