"""How a drafter fares on prompts per scenario, without timing: acceptance by draft position, α, and
the share of the target's tokens its output vocabulary cannot propose.

    python benchmarks/drafter_report.py --prompts benchmarks/unseen-prompts.jsonl --drafter head -k 3

Greedy, fixed K, the pair's drafter of that kind without prompt lookup in front. The output is the
target's (lossless), so the out-of-vocabulary share is measured on exactly what the target wrote.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.runtime import prepare
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--pair", default=None)
    parser.add_argument("--models", default=None)
    parser.add_argument("--drafter", default="head")
    parser.add_argument("-k", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--per-scenario", type=int, default=0, help="first N prompts of each scenario (0: all)")
    args = parser.parse_args()

    registry = load_registry(args.models)
    runtime = prepare(registry.pair(args.pair))
    drafter, _ = runtime.drafter_of(args.drafter)  # bare: no prompt lookup in front
    engine = SpeculativeEngine(runtime.target.model, drafter, runtime.eos_token_ids, runtime.block_plan)
    allowed = getattr(drafter, "allowed", None)
    vocab = None if allowed is None else set(allowed.tolist())

    offered, kept = defaultdict(lambda: [0] * args.k), defaultdict(lambda: [0] * args.k)
    judged, accepted, tokens, outside, seen = (defaultdict(int) for _ in range(5))
    for prompt in read_file(args.prompts):
        scenario = prompt.scenario or "default"
        if args.per_scenario and seen[scenario] >= args.per_scenario:
            continue
        seen[scenario] += 1
        ids = encode_prompt(runtime.tokenizer, prompt.text)
        for event in engine.generate(ids, k=args.k, max_new_tokens=args.max_new_tokens):
            for i in range(len(event.drafted)):
                offered[scenario][i] += 1
                kept[scenario][i] += i < event.accepted
            judged[scenario] += event.judged
            accepted[scenario] += event.accepted
            tokens[scenario] += len(event.emitted)
            outside[scenario] += sum(t not in vocab for t in event.emitted) if vocab is not None else 0
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
        }
    print(json.dumps({"drafter": args.drafter, "k": args.k, "max_new_tokens": args.max_new_tokens, "scenarios": report}))


if __name__ == "__main__":
    main()
