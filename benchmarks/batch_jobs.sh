#!/usr/bin/env bash
# Piped prompts as a user runs them: `specdec generate --json < FILE` at each batch size, with -k auto
# (the pair's default) and -k 0, every run a fresh process timed whole (start-up and prompts included),
# the sizes and modes interleaved over REPS rounds. Every answer's tokens are checked against the
# batch-1 `-k 0` run's: a batched or speculative answer that differs fails the script.
#
# Usage: benchmarks/batch_jobs.sh PROMPTS.jsonl MAX_NEW_TOKENS OUT.tsv [REPS] [SIZES]
#   e.g. benchmarks/batch_jobs.sh benchmarks/batch-jobs.jsonl 96 benchmarks/results/batch/batch-jobs.tsv 2 "1 8"
# OUT.tsv: rep, batch, k, wall_s, tokens, then per run the answers' p50/p90/p99 latency (s), from --json stats.
set -euo pipefail
prompts=$1 tokens=$2 out=$3 reps=${4:-2} sizes=${5:-"1 2 4 8 16"}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
printf 'rep\tbatch\tk\twall_s\ttokens\tp50_s\tp90_s\tp99_s\n' > "$out"
reference="$work/reference.jsonl"
OMP_NUM_THREADS=2 specdec generate --json --batch 1 -k 0 --max-new-tokens "$tokens" < "$prompts" > "$reference"
for rep in $(seq 1 "$reps"); do
  for batch in $sizes; do
    for k in auto 0; do
      answers="$work/$batch-$k.jsonl"
      start=$(date +%s.%N)
      OMP_NUM_THREADS=2 specdec generate --json --batch "$batch" -k "$k" --max-new-tokens "$tokens" < "$prompts" > "$answers"
      end=$(date +%s.%N)
      python3 - "$reference" "$answers" "$rep" "$batch" "$k" "$start" "$end" >> "$out" <<'EOF'
import json, sys
import numpy as np
reference, answers, rep, batch, k, start, end = sys.argv[1:]
want = [json.loads(line)["token_ids"] for line in open(reference)]
got = [json.loads(line) for line in open(answers)]
if [r["token_ids"] for r in got] != want:
    sys.exit(f"batch {batch}, -k {k}: answers differ from the batch-1 -k 0 run's")
latency = [r["stats"]["wall_s"] for r in got]
p50, p90, p99 = (np.percentile(latency, q) for q in (50, 90, 99))
tokens = sum(r["stats"]["new_tokens"] for r in got)
print(f"{rep}\t{batch}\t{k}\t{float(end) - float(start):.2f}\t{tokens}\t{p50:.2f}\t{p90:.2f}\t{p99:.2f}")
EOF
    done
  done
done
column -t "$out"
