#!/bin/bash
# A prompt's forward on specdec's kernels against the bfloat16 copies, on an AVX-512 VNNI + BF16 CPU
# without AMX, from the repository root, idle machine (../shared/tools/quiet-check before each run).
# Per prompt, one process, both ways (prefill-avx512.txt):
OMP_NUM_THREADS=2 python3 benchmarks/prefill.py --prompts benchmarks/unseen-sample.jsonl
# End to end, alternating kernels dense dense kernels (SPECDEC_DENSE_PREFILL=0 for the kernels, as the
# default now chooses on such a CPU; unset for the copies, as the default chose before): bench-*.json
python3 -m specdec_cli bench --prompts benchmarks/unseen-prompts.jsonl --max-new-tokens 64 --modes plain,auto --threads 2 --json
# Two more runs of the default as it now is (bench-5-kernels.json, bench-6-kernels.json), and its
# equivalence on the equivalence prompts (verify-equivalence.json):
python3 -m specdec_cli verify-equivalence --prompts examples/equivalence-prompts.jsonl -k 1,3,5 --json
# The batch job as a user runs it, one process each (batch-jobs-process.txt, seconds; the first run
# prepared the target):  time specdec generate --json [-k 0] < benchmarks/batch-jobs.jsonl > out.jsonl
# Low acceptance, sampled: the random prompts at temperature 0.7 and 1.0, one sample a prompt, the
# default as it now is (low-t0.7.json, low-t1.0.json, low-t1.0-b.json, low-t1.0-c.json):
python3 -m specdec_cli bench --prompts benchmarks/random-prompts.jsonl --max-new-tokens 64 --temperature 1.0 \
  --modes plain,auto --threads 2 --json
# and four samples a prompt, kernels copies copies kernels at seed 0, then copies kernels at seed 1
# (SPECDEC_DENSE_PREFILL=bfloat16 for the copies): low-t1.0-samples4-seed*-*.json
python3 -m specdec_cli bench --prompts benchmarks/random-prompts.jsonl --max-new-tokens 64 --temperature 1.0 \
  --samples 4 --seed 0 --modes plain,auto --threads 2 --json
