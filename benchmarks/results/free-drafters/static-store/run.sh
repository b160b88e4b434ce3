#!/bin/bash
# The live trial of a static store: the suffix memory filled with 150k tokens of the target's stored
# greedy answers before the first prompt (variant.diff, on commit b1ba001), beside auto as auto+free.
# Run from a checkout with variant.diff applied, on an idle machine.
SPECDEC_STATIC_STORE=150000 python3 -m specdec_cli bench --prompts benchmarks/unseen-prompts.jsonl \
    --max-new-tokens 64 --modes plain,auto,auto+free --threads 2 --json > bench-150k.json

# The same store (all 502k greedy answer tokens) beside prompt lookup alone, no head: a pair of
# lookup with `free: [suffix]` (models-lookup-store.yaml); auto weighs lookup and the store, auto-free lookup alone.
SPECDEC_STATIC_STORE=600000 python3 -m specdec_cli bench --models benchmarks/results/free-drafters/static-store/models-lookup-store.yaml \
    --prompts benchmarks/unseen-prompts.jsonl --max-new-tokens 64 --modes plain,auto,auto-free --threads 2 \
    --json > bench-lookup-store.json

# Alternating runs against today's default (head and lookup), old new new old:
# abba-1-head.json, abba-2-store.json, abba-3-store.json, abba-4-head.json, each `--modes plain,auto`,
# the head's with the packaged models.yaml, the store's with models-lookup-store.yaml as above.
# The lookup-and-store run again at commit 7f5d96e: bench-lookup-store-b.json.
