#!/usr/bin/env bash
# The head after a prompt longer than a verify block (benchmarks/long-german-prompt.txt, 90 tokens):
# `generate --json --max-new-tokens 128` at -k 0, --drafter head -k 3 and -k auto, this tree against
# another checkout (OLD_TREE), interleaved, each run a fresh process (a stall lands once a process).
# Each tree has its own cache under CACHES (CACHES/old, CACHES/new, each holding the GGUF's conversion).
# Run on an idle machine (../shared/tools/quiet-check).
#   bash benchmarks/long_prompt_head.sh OLD_TREE CACHES [ROUNDS] > OUT.tsv
set -euo pipefail
old=$(cd "$1" && pwd); caches=$2; rounds=${3:-2}
new=$(cd "$(dirname "$0")/.." && pwd)
prompt="$new/benchmarks/long-german-prompt.txt"
printf 'round\tmode\ttree\ttokens_per_s\tnew_tokens\trounds\taccepted\tdrafted\ttokens\n'
for round in $(seq "$rounds"); do
  for mode in "-k 0" "--drafter head -k 3" "-k auto"; do
    for side in old new; do
      tree=$new; [ "$side" = old ] && tree=$old
      # shellcheck disable=SC2086
      line=$(cd "$tree" && SPECDEC_CACHE="$caches/$side" PYTHONPATH="$tree" python3 -m specdec_cli generate --json $mode \
             --max-new-tokens 128 < "$prompt" 2>/dev/null)
      python3 - "$line" "$round" "$mode" "$side" <<'PY'
import hashlib, json, sys
result = json.loads(sys.argv[1]); stats = result["stats"]
tokens = hashlib.sha256(json.dumps(result["token_ids"]).encode()).hexdigest()[:10]
print("\t".join(map(str, [*sys.argv[2:5], stats["tokens_per_s"], stats["new_tokens"], stats["rounds"], stats["accepted"],
                          stats["drafted"], tokens])))
PY
    done
  done
done
