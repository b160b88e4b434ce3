"""Does `auto` know what its rounds will give? For every round the adaptive controller chose, the tokens
and seconds it predicted for that drafter and K (``AdaptiveK.round``) against what the round gave, by
drafter and K, over the tuning prompts (never the unseen ones), twice through, one process, greedy, 64
tokens. Run on an idle machine (../shared/tools/quiet-check); prints the table that docs/notebook.md
quotes ("Does `auto` know what its rounds give?").

    python3 benchmarks/controller_predictions.py [PROMPTS.jsonl ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict

import torch

from specdec_cli.decoding.control.adaptive import AdaptiveK
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.decoding.schedule import Take
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt

TUNING = [f"benchmarks/{name}.jsonl" for name in ("heldout-prompts", "bench-prompts", "random-prompts", "lossy-prompts")]
SHOWN = 15  # rounds a drafter and K needs to be listed


class Recorded(AdaptiveK):
    """The controller as it is, remembering what it predicted for the round it chose."""

    def plan(self, offers, learned, room):
        plan = super().plan(offers, learned, room)
        if plan.take in (Take.OFFER, Take.LEARNED) and plan.k:  # a chain: what round() predicts
            self.predicted = (plan.source, plan.k, *self.round(plan.source, plan.k))
        else:
            self.predicted = ("-", 0, 1.0, self.costs.verify_s(0) + self.costs.overhead_s())
        return plan


def main() -> None:
    torch.set_num_threads(2)
    runtime = load_pair(load_registry(None).pair(None))
    controller = runtime.controller(None)
    files = sys.argv[1:] or TUNING
    rows = [json.loads(line) for path in files for line in open(path) if line.strip()]
    rounds = defaultdict(list)
    for row in rows * 2:
        schedule = controller.schedule(row.get("scenario"))
        schedule.__class__ = Recorded  # the scenario's own controller, its estimates kept
        for event in runtime.engine.generate(encode_prompt(runtime.tokenizer, row["prompt"]), k=schedule, max_new_tokens=64):
            name, k, tokens, seconds = schedule.predicted
            rounds[(name, k)].append((tokens, len(event.emitted), seconds, event.draft_s + event.verify_s + event.other_s))
    print(f"{len(rows)} prompts from {', '.join(files)}, twice")
    for (name, k), seen in sorted(rounds.items()):
        if len(seen) < SHOWN:
            continue
        mean = [statistics.median(r[i] for r in seen) if i >= 2 else statistics.mean(r[i] for r in seen) for i in range(4)]
        print(f"{name:>10} K {k}: {len(seen):5d} rounds; tokens predicted {mean[0]:.2f}, kept {mean[1]:.2f}; "
              f"ms predicted {mean[2] * 1000:.2f}, taken {mean[3] * 1000:.2f} (medians)")


if __name__ == "__main__":
    main()
