#!/usr/bin/env bash
# Does `specdec predict` foretell what `calibrate-k` then measures? On one prompt file: predict
# (K 1-4, its own sample of the file), calibrate-k on the whole file (K 0-4), predict again, one
# process after another on an idle machine (../shared/tools/quiet-check); then the table of predicted
# against measured speed-up per K, and the K each chooses. docs/design.md ("Before a long run") quotes it.
#
#   bash benchmarks/prediction_check.sh [PROMPTS.jsonl] [OUT_DIR] [PAIR]
set -euo pipefail
prompts=${1:-benchmarks/unseen-prompts.jsonl}
out=${2:-benchmarks/results/prediction}
pair=${3:-smollm2-135m}
mkdir -p "$out"
specdec predict --pair "$pair" --prompts "$prompts" -k 1..4 --threads 2 --json > "$out/predict-1.json"
specdec calibrate-k --pair "$pair" --prompts "$prompts" --k 0..4 --max-new-tokens 64 --threads 2 --json > "$out/calibrate.json"
specdec predict --pair "$pair" --prompts "$prompts" -k 1..4 --threads 2 --json > "$out/predict-2.json"
python3 - "$out" <<'EOF' | tee "$out/check.md"
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
runs = [json.loads((out / f"predict-{i}.json").read_text()) for i in (1, 2)]
measured = json.loads((out / "calibrate.json").read_text())["overall"]
speed = {row["k"]: row["speedup"] for row in measured["per_k"] if row["k"]}
print("| K | predicted (before) | predicted (after) | measured | error (before, after) |")
print("|---|---|---|---|---|")
for k, value in speed.items():
    guesses = [next(row["speedup"]["exact"] for row in run["per_k"] if row["k"] == k) for run in runs]
    errors = ", ".join(f"{guess / value - 1:+.1%}" for guess in guesses)
    print(f"| {k} | {guesses[0]:.3f}× | {guesses[1]:.3f}× | {value:.3f}× | {errors} |")
chosen = [run["choice"]["exact"]["best_k"] for run in runs]
print(f"\nbest measured K {measured['best_k']}; predicted K {chosen[0]} (before), {chosen[1]} (after); "
      f"α predicted {runs[0]['alpha']['exact']['value']}, {runs[1]['alpha']['exact']['value']}; measured (all K pooled) {measured['alpha']}")
EOF
