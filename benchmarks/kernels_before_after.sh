#!/usr/bin/env bash
# specdec's own kernels against torch's (SPECDEC_TORCH_KERNELS=1), the same tree and prompts, interleaved
# torch q8 q8 torch, each run a fresh process (each kernel prepares its own target once, before any timing):
#   - the 80 unseen prompts, 64 greedy tokens, --modes plain,auto,ngram:4,ngram+head:3;
#   - the 8 low-acceptance prompts (benchmarks/random-prompts.jsonl) at temperature 0, 0.7 and 1.0, plain,auto.
# Writes OUT/unseen-N-KERNEL.json and OUT/random-tT-N-KERNEL.json and prints one line per run, with every
# scenario's auto / plain. Run on an idle machine (../shared/tools/quiet-check); ATEN_CPU_CAPABILITY=avx2
# for the AVX2 path; ORDER="torch q8" for one run of each.
#   bash benchmarks/kernels_before_after.sh OUT
set -euo pipefail
out=$1
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
summary() {
  python3 - "$1" "$2" <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))
modes = result["modes"]
line = [sys.argv[2]] + [f"{m} {f['tokens_per_s']} tok/s x{f['speedup_vs_plain']} identical={f['identical_to_plain']}"
                        for m, f in modes.items()]
scenarios = result.get("scenarios") or {}
if "auto" in modes and len(scenarios) > 1:
    line.append("auto by scenario " + " ".join(f"{s}:{v['auto']['speedup_vs_plain']}" for s, v in sorted(scenarios.items())))
print(*line, sep="  ")
PY
}
n=0
for kernel in ${ORDER:-torch q8 q8 torch}; do
  n=$((n + 1))
  torch_kernels=""; [ "$kernel" = torch ] && torch_kernels=1
  SPECDEC_TORCH_KERNELS=$torch_kernels python3 -m specdec_cli bench --prompts "$root/benchmarks/unseen-prompts.jsonl" \
    --max-new-tokens 64 --modes plain,auto,ngram:4,ngram+head:3 --threads 2 --json > "$out/unseen-$n-$kernel.json"
  summary "$out/unseen-$n-$kernel.json" "unseen $kernel"
  for t in 0 0.7 1.0; do
    SPECDEC_TORCH_KERNELS=$torch_kernels python3 -m specdec_cli bench --prompts "$root/benchmarks/random-prompts.jsonl" \
      --max-new-tokens 64 --modes plain,auto --temperature "$t" --threads 2 --json > "$out/random-t$t-$n-$kernel.json"
    summary "$out/random-t$t-$n-$kernel.json" "random t=$t $kernel"
  done
done
