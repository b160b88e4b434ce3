#!/bin/bash
# The store beside the pair's drafters, measured from the repository root on an idle machine
# (../../../../../shared/tools/quiet-check before each run). The default pair weighs its store beside
# the head and lookup (`free: [store]`): `auto` is the default, `auto-free` the pair without the store.
# models-lookup-store.yaml is prompt lookup with the store and no head: `auto` lookup and the store,
# `auto-free` lookup alone. Runs alternate: default pair, lookup pair, lookup pair, default pair.
bench() {
  python3 -m specdec_cli bench "$@" --prompts benchmarks/unseen-prompts.jsonl --max-new-tokens 64 \
    --modes plain,auto,auto-free --threads 2 --json
}
D=benchmarks/results/free-drafters/store
bench > $D/abab-1-store-beside-head.json
bench --models $D/models-lookup-store.yaml > $D/abab-2-store-beside-lookup.json
bench --models $D/models-lookup-store.yaml > $D/abab-3-store-beside-lookup.json
bench > $D/abab-4-store-beside-head.json

# Low acceptance, sampled: the random prompts at temperatures 1.0, 0.7 and 1.0 again.
for t in 1.0-a 0.7-a 1.0-b; do
  python3 -m specdec_cli bench --prompts benchmarks/random-prompts.jsonl --max-new-tokens 64 --temperature ${t%-*} \
    --modes plain,auto,auto-free --threads 2 --json > $D/low-t$t.json
done

# The store's acceptance by position (the controller's priors), on the tuning prompts less the held-out
# ones, whose answers the store holds: priors.json
python3 benchmarks/free_drafter_priors.py --prompts examples/calibration-prompts.jsonl benchmarks/bench-prompts.jsonl \
  benchmarks/random-prompts.jsonl examples/equivalence-prompts.jsonl benchmarks/lossy-prompts.jsonl

# The batch job as a user runs it, one process each, alternating -k 0 and the default (whole-process
# seconds in batch-jobs-process.txt):
#   time specdec generate --json [-k 0] < benchmarks/batch-jobs.jsonl > out.jsonl

# The suffix memory beside the store too (models-store-and-suffix.yaml: the packaged models.yaml with
# `free: [store, suffix]`), alternating with the packaged pair: suffix-trial-*.json (`--modes plain,auto`
# on the unseen prompts) and suffix-trial-batch-process.txt (whole-process seconds of the batch job).

# A floor of 0.4 on the store's drafts (its continuation(..., floor=0.4) in StoreDrafter.propose, its
# priors replayed again: priors-floor04.json), alternating with the packaged pair, `--modes plain,auto`:
# floor-trial-*.json.

# The store's drafts tagged `-split` where their first token had no majority (split-variant.diff applied,
# its priors replayed with the command above: priors-split.json), alternating with the packaged pair,
# `--modes plain,auto`, split default default split: split-trial-*.json.
