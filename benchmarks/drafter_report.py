"""How a drafter fares on prompts per scenario, without timing: acceptance by draft position, α, and
the share of the target's tokens its output vocabulary cannot propose, and first-position acceptance
split by whether the target's token copies its context (the bigram it closes occurs earlier in the
prompt or output) or is fresh.

    python benchmarks/drafter_report.py --prompts benchmarks/unseen-prompts.jsonl --drafter head -k 3

Greedy, fixed K, the pair's drafter of that kind without prompt lookup in front (``--lookup``: with
it, as bench's ``ngram+`` modes; the vocabulary share is still the learned drafter's; ``--draft DIR``: a
head directory instead; ``--dtype``: the target's precision; ``--head-precision``: the head's, float32
or int8, where a quantised target's head runs int8; ``--vocab full|N``: a head's output
layer widened at inference to all ids, or to the N ids the target writes most often in
examples/answers/, to see what its vocabulary costs in acceptance; ``--lookup-in-chain N``: a
probe of per-token fusion, see LookupInChain). The output is the
target's (lossless), so the out-of-vocabulary share is measured on exactly what the target wrote.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import torch

from specdec_cli.decoding.drafters.base import Draft, Drafter, Verified
from specdec_cli.decoding.drafters.lookup import NgramDrafter
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.drafters.head import HeadDrafter, load_head
from specdec_cli.decoding.loaded_pair import composed, load_pair
from specdec_cli.pairs.registry import load_registry, override
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file


def closes_earlier_bigram(tokens: list[int]) -> list[bool]:
    """Per token, whether it and the token before it occurred together earlier in ``tokens``: a
    token the context could have been copied from (prompt lookup's one-token match)."""
    seen, flags = set(), [False] * len(tokens)
    for i in range(1, len(tokens)):
        if i >= 2:
            seen.add((tokens[i - 2], tokens[i - 1]))  # every pair that ends before token i
        flags[i] = (tokens[i - 1], tokens[i]) in seen
    return flags


def frequent_ids(size: int):
    """The ``size`` ids the target wrote most often in examples/answers/ (its answers, not the prompts)."""
    from collections import Counter
    from pathlib import Path

    import torch

    from specdec_cli.training.corpus import read_shards

    counts = Counter()
    root = Path(__file__).resolve().parent.parent / "examples" / "answers"
    for directory in ("requests", "answers"):
        for row in read_shards(root / directory):
            counts.update(row["ids"][row["start"] :])
    return torch.tensor(sorted(token for token, _ in counts.most_common(size)), dtype=torch.long)


class LookupInChain(Drafter):
    """A probe, not a drafter we ship: the head's greedy chain, where from the second token on prompt
    lookup takes over whenever the context and the draft so far end in an n-gram of at least
    ``min_ngram`` tokens seen earlier (per-token fusion of the two). On the 34
    ``expected_alpha`` prompts it left α where lookup-first had it (0.515 at n ≥ 2 and 3, 0.481 at 1)."""

    def __init__(self, head: HeadDrafter, min_ngram: int):
        self.head, self.name = head, head.name
        self.allowed, self.needs = head.allowed, head.needs
        # One index, extended token by token along a chain (and rebuilt once a round, where the
        # context no longer extends the last draft).
        self.lookup = NgramDrafter(max_ngram=3, min_ngram=min_ngram)

    def reset(self) -> None:
        self.head.reset()
        self.lookup.reset()

    def observe(self, verified: Verified) -> None:
        self.head.observe(verified)

    @torch.inference_mode()
    def propose(self, context, k, sampling, generator, gate=None) -> Draft:
        head, n = self.head, context.shape[0]
        guess, caught_up = head._catch_up(context)
        tokens = []
        for i in range(k):
            lookup = self.lookup.propose(torch.cat([context, torch.tensor(tokens, dtype=torch.long)]), 1, None, None)
            token = int(lookup.tokens[0]) if i and len(lookup) else int(head._logits(guess).argmax())
            tokens.append(token)
            if i + 1 < k:
                guess = head._step(torch.tensor([token]), guess.view(1, -1), n + i, fuse=False)
        head.cached_tokens = torch.cat([context, torch.tensor(tokens[:-1], dtype=torch.long)])
        return Draft(torch.tensor(tokens, dtype=torch.long), source=head.name, catchup_s=caught_up)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--pair", default=None)
    parser.add_argument("--models", default=None)
    parser.add_argument("--drafter", default="head")
    parser.add_argument("-k", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--draft", default=None)
    parser.add_argument("--vocab", default=None, help="full, or N: the N most frequent ids of examples/answers")
    parser.add_argument("--head-precision", default=None, help="float32 or int8 (default: as the target, see HeadDrafter)")
    parser.add_argument("--per-scenario", type=int, default=0, help="first N prompts of each scenario (0: all)")
    parser.add_argument("--lookup-in-chain", type=int, default=0, metavar="N",
                        help="a probe: lookup takes over mid-chain on an n-gram of N+ tokens (greedy, a head)")
    parser.add_argument("--lookup", action="store_true", help="prompt lookup first, as bench's ngram+ modes (its rounds count too)")
    args = parser.parse_args()

    registry = load_registry(args.models)
    pair = override(registry.pair(args.pair), dtype=args.dtype, draft=args.draft)
    runtime = load_pair(pair)
    drafter, _ = runtime.drafter_of(args.drafter)  # bare: no prompt lookup in front
    if args.vocab or args.head_precision:
        head = load_head(pair.alternate("head").head, runtime.target.model, runtime.target.source).head  # the float head
        allowed = drafter.allowed if not args.vocab else None if args.vocab == "full" else frequent_ids(int(args.vocab))
        drafter = HeadDrafter(head, runtime.target.model, allowed, args.head_precision or runtime.target.precision)
    allowed = getattr(drafter, "allowed", None)
    if args.lookup_in_chain:
        drafter = LookupInChain(drafter, args.lookup_in_chain)
    drafter = composed(drafter, args.lookup)  # prompt lookup first, as bench's ngram+ modes
    engine = SpeculativeEngine(runtime.target.model, drafter, runtime.eos_token_ids, runtime.block_plan)
    vocab = None if allowed is None else set(allowed.tolist())

    offered, kept = defaultdict(lambda: [0] * args.k), defaultdict(lambda: [0] * args.k)
    judged, accepted, tokens, outside, seen = (defaultdict(int) for _ in range(5))
    first = defaultdict(lambda: {"copy": [0, 0], "fresh": [0, 0]})  # first position: [kept, offered]
    for prompt in read_file(args.prompts):
        scenario = prompt.scenario or "default"
        if args.per_scenario and seen[scenario] >= args.per_scenario:
            continue
        seen[scenario] += 1
        ids = encode_prompt(runtime.tokenizer, prompt.text)
        sequence, rounds = list(ids), []  # rounds: (index of the round's first token, its draft kept)
        for event in engine.generate(ids, k=args.k, max_new_tokens=args.max_new_tokens):
            if event.drafted and event.emitted:
                rounds.append((len(sequence), event.accepted > 0))
            sequence += event.emitted
            for i in range(len(event.drafted)):
                offered[scenario][i] += 1
                kept[scenario][i] += i < event.accepted
            judged[scenario] += event.judged
            accepted[scenario] += event.accepted
            tokens[scenario] += len(event.emitted)
            outside[scenario] += sum(t not in vocab for t in event.emitted) if vocab is not None else 0
        copies = closes_earlier_bigram(sequence)
        for index, kept_it in rounds:
            counts = first[scenario]["copy" if copies[index] else "fresh"]
            counts[0] += kept_it
            counts[1] += 1
    report = {}
    for scenario in list(seen) + ["all"]:
        names = list(seen) if scenario == "all" else [scenario]
        off = [sum(offered[s][i] for s in names) for i in range(args.k)]
        kp = [sum(kept[s][i] for s in names) for i in range(args.k)]
        report[scenario] = {
            "prompts": sum(seen[s] for s in names),
            "alpha": round(sum(accepted[s] for s in names) / max(1, sum(judged[s] for s in names)), 3),
            "per_position": [round(k / n, 3) if n else None for k, n in zip(kp, off)],
            "tokens": sum(tokens[s] for s in names),
            "outside_vocab": round(sum(outside[s] for s in names) / max(1, sum(tokens[s] for s in names)), 4),
            "first_position": {kind: {"accepted": round(sum(first[s][kind][0] for s in names) / max(1, n), 3), "rounds": n}
                               for kind in ("copy", "fresh") for n in [sum(first[s][kind][1] for s in names)]},
        }
    print(json.dumps({"drafter": args.draft or args.drafter, "lookup": args.lookup, "lookup_in_chain": args.lookup_in_chain, "dtype": args.dtype, "vocab": args.vocab or (None if vocab is None else len(vocab)), "k": args.k, "max_new_tokens": args.max_new_tokens, "scenarios": report}))


if __name__ == "__main__":
    main()
