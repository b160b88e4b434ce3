# Interleaved old/new bench of auto+free on the unseen prompts: OLD is a checkout, NEW the same
# with variant.diff applied (git worktree add NEW; git -C NEW apply variant.diff).
#   OLD=/path/main NEW=/path/variant OUT=/tmp/ab bash run.sh    (SIDES="new old": a shorter repeat)
set -euo pipefail
export PYTHONDONTWRITEBYTECODE=1
out=${OUT:-/tmp/ab}; mkdir -p $out; n=0
for side in ${SIDES:-old new new old}; do
  n=$((n + 1)); tree=$NEW; [ "$side" = old ] && tree=$OLD
  (cd $tree && PYTHONPATH=$tree python3 -m specdec_cli bench --prompts "$OLD/benchmarks/unseen-prompts.jsonl" \
     --max-new-tokens 64 --modes plain,auto+free --threads 2 --json > $out/bench-$n-$side.json 2>$out/bench-$n-$side.err)
  python3 - $out/bench-$n-$side.json $side <<'PY'
import json, sys
modes = json.load(open(sys.argv[1]))["modes"]
print(sys.argv[2], *(f"{m} {f['tokens_per_s']} tok/s x{f['speedup_vs_plain']} tpr={f['mean_accepted_length']} identical={f['identical_to_plain']}"
                     for m, f in modes.items()), sep="  ", flush=True)
PY
done
