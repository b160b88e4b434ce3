#!/usr/bin/env bash
# The controller's trees on the real pair (int4 target, shipped head), scaled to a short lock:
# verify-equivalence with trees (greedy and sampling), a calibration with tree budgets (its profile seeds
# auto), and an interleaved bench of the best chains, two tree budgets, and auto without and with trees.
# Run from the repository root under the lock: /tmp/tools/cpu bash benchmarks/trees_int4.sh [step...]
set -u
out=benchmarks/results
spec() { PYTHONPATH=$PWD python3 -m specdec_cli "$@"; }
steps=${*:-"equivalence calibrate bench"}
for step in $steps; do
  case $step in
    equivalence)
      spec verify-equivalence --prompts examples/equivalence-prompts.jsonl --tree 4,10 --max-new-tokens 16 \
        --sampling 40 --json --report $out/trees-int4-verify-equivalence.json > /dev/null; echo "verify-equivalence rc=$?" ;;
    calibrate)
      /work/shared/tools/quiet-check 1.5
      spec calibrate-k --prompts benchmarks/bench-prompts.jsonl -k 0,2,3 --tree 4,8 --max-new-tokens 24 \
        --json --write --profile $out/trees-int4-profile.yaml > $out/trees-int4-calibrate.json; echo "calibrate-k rc=$?" ;;
    bench)
      /work/shared/tools/quiet-check 1.5
      profile=(); [ -f $out/trees-int4-profile.yaml ] && profile=(--profile $out/trees-int4-profile.yaml)
      spec bench --prompts benchmarks/unseen-sample.jsonl --max-new-tokens 32 "${profile[@]}" \
        --modes plain,head:2,head:3,tree:6,tree:10,auto,auto+tree --json > $out/trees-int4.json; echo "bench rc=$?" ;;
  esac
done
