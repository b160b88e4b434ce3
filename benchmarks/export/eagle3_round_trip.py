"""An eagle3 export served by a real vLLM: drafts and acceptance from its /metrics on a prompt file,
greedy, beside the same prompts' acceptance in specdec's own loop (given as a number).

    python benchmarks/export/eagle3_round_trip.py EAGLE3_DIR [--prompts FILE] [--k 3] [--max-tokens 64]

Prints one JSON object: drafts, draft tokens, accepted, alpha (accepted / drafted), per-position
acceptance, the server's start-up seconds and log. Starts and stops its own server (specdec_cli/serving).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specdec_cli.pairs.loading import transformers_directory
from specdec_cli.pairs.registry import load_registry
from specdec_cli.prompts import read_file
from specdec_cli.serving import metrics
from specdec_cli.serving.client import complete
from specdec_cli.serving.configs import encode_prompts
from specdec_cli.serving.server import ManagedServer, ServerConfig


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("eagle3_dir", type=Path)
    parser.add_argument("--prompts", type=Path, default=Path("examples/equivalence-prompts.jsonl"))
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--pair", default=None)
    args = parser.parse_args()
    pair = load_registry().pair(args.pair)
    model_dir = transformers_directory(pair.target.source)
    prompts = encode_prompts(model_dir, [(item.id or str(i), item.text) for i, item in enumerate(read_file(args.prompts))])
    speculative = {"method": "eagle3", "model": str(args.eagle3_dir.resolve()), "num_speculative_tokens": args.k}
    config = ServerConfig(f"vllm-eagle3:{args.k}", model_dir, pair.name, speculative, threads=2)
    with ManagedServer(config, progress=lambda line: print(line, file=sys.stderr)) as server:
        before = metrics.scrape(server.endpoint)
        outputs = [complete(server.endpoint, ids, args.max_tokens) for _, ids in prompts]
        window = metrics.scrape(server.endpoint).minus(before)
        drafted, accepted = window.value(metrics.DRAFT_TOKENS), window.value(metrics.ACCEPTED)
        drafts = window.value(metrics.DRAFTS)
        print(json.dumps({
            "eagle3_dir": str(args.eagle3_dir), "prompts": str(args.prompts), "k": args.k, "max_tokens": args.max_tokens,
            "requests": len(outputs), "failures": sum(1 for o in outputs if o.error),
            "generated_tokens": sum(len(o.token_ids) for o in outputs),
            "drafts": drafts, "draft_tokens": drafted, "accepted_tokens": accepted,
            "alpha": accepted / drafted if drafted else None,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None,
            "per_position": [v / drafts for v in window.per_position()] if drafts else [],
            "start_s": server.started_s, "log": str(server.log_path),
        }, indent=1))


if __name__ == "__main__":
    main()
