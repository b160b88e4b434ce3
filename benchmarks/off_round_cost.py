"""What a round costs while adaptive speculation is off, against a round of plain decoding.

Off, the default drafter still sees every round: the engine looks up prompt lookup's match, hands
the target's features to the head, and the controller plans and observes; it never drafts. The two
run interleaved on the same prompts (plain first, then off, then the other way round), and the
mean seconds per round are compared.

    PYTHONPATH=. python benchmarks/off_round_cost.py --prompts benchmarks/random-prompts.jsonl --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import time

from specdec_cli.decoding.control.adaptive import AdaptiveK
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.schedule import Plan
from specdec_cli.decoding.control.priors import Prior
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file


class AlwaysOff(AdaptiveK):
    """The real controller's work every round, and its answer overruled: draft nothing."""

    def plan(self, offers, learned, room):
        super().plan(offers, learned, room)
        return Plan.nothing()


def seconds_per_round(engine, ids, schedule, max_new_tokens) -> tuple[float, int]:
    started, rounds = time.perf_counter(), 0
    for _ in engine.generate(ids, k=schedule, max_new_tokens=max_new_tokens):
        rounds += 1
    return time.perf_counter() - started, rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    runtime = load_pair(load_registry().pair(None))
    plain = SpeculativeEngine(runtime.target.model, None, runtime.eos_token_ids, runtime.block_plan)
    off = runtime.engine
    prompts = [encode_prompt(runtime.tokenizer, p.text) for p in read_file(args.prompts)]
    seconds_per_round(plain, prompts[0], 0, 4), seconds_per_round(off, prompts[0], AlwaysOff(Prior(0, 0.0, 0.2)), 4)
    totals = {"plain": [0.0, 0], "off": [0.0, 0]}
    for repeat in range(args.repeats):
        for index, ids in enumerate(prompts):
            order = ["plain", "off"] if (index + repeat) % 2 == 0 else ["off", "plain"]
            for name in order:
                engine, schedule = (plain, 0) if name == "plain" else (off, AlwaysOff(Prior(0, 0.0, 0.2), main="head"))
                seconds, rounds = seconds_per_round(engine, ids, schedule, args.max_new_tokens)
                totals[name][0] += seconds
                totals[name][1] += rounds
    per_round = {name: seconds / rounds for name, (seconds, rounds) in totals.items()}
    print(json.dumps({"drafter": runtime.drafter.name, "rounds": totals["plain"][1],
                      "plain_ms_per_round": round(per_round["plain"] * 1000, 3),
                      "off_ms_per_round": round(per_round["off"] * 1000, 3),
                      "off_over_plain": round(per_round["off"] / per_round["plain"], 4)}))


if __name__ == "__main__":
    main()
