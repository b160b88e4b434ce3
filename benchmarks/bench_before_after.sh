#!/usr/bin/env bash
# `specdec bench --modes plain,auto` on the unseen prompts, this tree against another checkout
# (OLD_TREE), old new new old, each run a fresh process with its own cache (CACHES/old, CACHES/new:
# each prepares its target once, before any timing). Writes OUT/bench-N-SIDE.json and prints one
# line per run. Run on an idle machine (../shared/tools/quiet-check).
#   bash benchmarks/bench_before_after.sh OLD_TREE CACHES OUT [PROMPTS]
set -euo pipefail
old=$(cd "$1" && pwd); caches=$2; out=$3
new=$(cd "$(dirname "$0")/.." && pwd)
prompts=$(cd "$(dirname "${4:-$new/benchmarks/unseen-prompts.jsonl}")" && pwd)/$(basename "${4:-unseen-prompts.jsonl}")
mkdir -p "$out"
n=0
for side in old new new old; do
  n=$((n + 1))
  tree=$new; [ "$side" = old ] && tree=$old
  (cd "$tree" && SPECDEC_CACHE="$caches/$side" PYTHONPATH="$tree" python3 -m specdec_cli bench --prompts "$prompts" \
     --max-new-tokens 64 --modes plain,auto --threads 2 --json > "$out/bench-$n-$side.json")
  python3 - "$out/bench-$n-$side.json" "$side" <<'PY'
import json, sys
modes = json.load(open(sys.argv[1]))["modes"]
print(sys.argv[2], *(f"{m} {f['tokens_per_s']} tok/s ×{f['speedup_vs_plain']} identical={f['identical_to_plain']}"
                     for m, f in modes.items()), sep="  ")
PY
done
