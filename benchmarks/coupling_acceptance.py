"""A drafter's first-guess acceptance under the two exact sampling rules, on the same positions: the
min(1, p/q) rule with a residual draw (expected acceptance Σ min(p, q) = 1 − TV; p(x) for a
deterministic draft x) and the race under shared noise that fixes the text by the seed
(decoding/coupling.py; P(both races pick the same id), or P(the target's race picks x), estimated
over --draws noise rows per position).

    python benchmarks/coupling_acceptance.py --prompts benchmarks/unseen-prompts.jsonl --temperatures 0.7 1.0
    python benchmarks/coupling_acceptance.py --prompts benchmarks/unseen-prompts.jsonl --drafter ngram

Each prompt is sampled with the drafter drafting one token a round (K = 1, seed 0), so every round it
drafts gives one position where it guessed on the target's true context; both rules' chance of
keeping that guess is computed there from the target's p (and the head's q). A deterministic drafter
(lookup, recycling, the memory, a tree's candidates) is kept with chance p(x) under either rule: its
two figures differ by the estimate's noise alone. Untimed.
"""

from __future__ import annotations

import argparse
import json

import torch

from specdec_cli.decoding.acceptance import SamplingParams, distribution
from specdec_cli.decoding.coupling import exponentials, race_winner
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file


class Recording(SpeculativeEngine):
    """The engine, recording (p, q) of each round's first draft token before accepting as usual."""

    def __init__(self, *args, sampling: SamplingParams, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampling, self.pairs = sampling, []

    def _accept(self, request, draft, tree, logits):
        if len(draft):
            p = distribution(logits[0], self.sampling)
            q = draft.probs[0].to(p) if draft.probs is not None else torch.nn.functional.one_hot(draft.tokens[:1], p.shape[-1])[0].to(p)
            self.pairs.append((p, q))
        return super()._accept(request, draft, tree, logits)


def rule_acceptance(p: torch.Tensor, q: torch.Tensor, draws: int, seed: int) -> tuple[float, float]:
    """(Σ min(p, q), the share of ``draws`` noise rows under which p's and q's races pick one id; a
    one-hot q's race picks its id whatever the noise)."""
    same = sum(int(race_winner(p, e) == race_winner(q, e))
               for e in (exponentials(seed, i, p.shape[-1]) for i in range(draws)))
    return float(torch.minimum(p, q).sum()), same / draws


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--draws", type=int, default=64)
    parser.add_argument("--limit", type=int, default=0, help="the first N prompts only (0: all)")
    parser.add_argument("--drafter", default="head", help="the pair's drafter of this kind (head, model, ngram)")
    args = parser.parse_args()
    runtime = load_pair(load_registry().pair(None))
    drafter, _ = runtime.drafter_of(args.drafter)
    prompts = read_file(args.prompts)[: args.limit or None]
    for temperature in args.temperatures:
        sampling = SamplingParams(temperature)
        engine = Recording(runtime.target.model, drafter, runtime.eos_token_ids, runtime.block_plan, sampling=sampling)
        for prompt in prompts:
            ids = encode_prompt(runtime.tokenizer, prompt.text)
            for _ in engine.generate(ids, k=1, max_new_tokens=args.max_new_tokens, sampling=sampling, seed=0):
                pass
        # Noise seeds apart from the run's (seed 0): the estimate must not reuse the noise that chose the text.
        rates = [rule_acceptance(p, q, args.draws, 1_000 + i) for i, (p, q) in enumerate(engine.pairs)]
        residual = sum(r for r, _ in rates) / len(rates)
        race = sum(c for _, c in rates) / len(rates)
        print(json.dumps({"drafter": args.drafter, "temperature": temperature, "positions": len(rates), "prompts": len(prompts),
                          "residual_rule": round(residual, 4), "race": round(race, 4),
                          "race_over_residual": round(race / residual, 4)}), flush=True)


if __name__ == "__main__":
    main()
