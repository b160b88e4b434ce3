#!/usr/bin/env bash
# Warm start of `specdec generate --json -k K --max-new-tokens 1 "Hi"`, wall seconds, this tree against
# another checkout (OLD_TREE), interleaved: every round runs -k 0 and -k auto on both, and the floor under
# both, `import torch` alone (tree "torch", k "-"). Each tree has its own cache (prepared files are keyed
# by the code, and each tree would replace the other's); the GGUF conversion is shared. Run on an idle
# machine (../shared/tools/quiet-check).
#   bash benchmarks/startup.sh OLD_TREE [ROUNDS] [OUT.tsv]
set -euo pipefail
old=$(cd "$1" && pwd); rounds=${2:-5}; out=${3:-/dev/stdout}
new=$(cd "$(dirname "$0")/.." && pwd)
cache=${SPECDEC_CACHE:-${HF_HOME:-$HOME/.cache/huggingface}/specdec}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for side in old new; do
  mkdir -p "$work/$side"
  for converted in "$cache"/*/config.json; do ln -s "$(dirname "$converted")" "$work/$side/"; done
done
run() {  # side k -> seconds
  local tree=$old; [ "$1" = new ] && tree=$new
  (cd "$tree" && SPECDEC_CACHE="$work/$1" PYTHONPATH="$tree" /usr/bin/time -f %e -o "$work/time" \
     python3 -m specdec_cli generate --json -k "$2" --max-new-tokens 1 "Hi" >/dev/null 2>"$work/err") || { cat "$work/err" >&2; exit 1; }
  cat "$work/time"
}
for side in old new; do run $side auto >/dev/null; done  # prepare each tree's target and block costs once
printf 'round\tk\ttree\tseconds\n' > "$work/runs"
floor() {  # seconds of importing torch alone, as the commands do (leaving without the teardown)
  /usr/bin/time -f %e -o "$work/time" python3 -c "import torch, os; os._exit(0)" && cat "$work/time"
}
for i in $(seq "$rounds"); do
  for k in 0 auto; do
    for side in old new; do printf '%s\t%s\t%s\t%s\n' "$i" "$k" "$side" "$(run $side $k)" >> "$work/runs"; done
  done
  printf '%s\t-\ttorch\t%s\n' "$i" "$(floor)" >> "$work/runs"
done
python3 - "$work/runs" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in list(open(sys.argv[1]))[1:]:
    _, k, tree, seconds = line.split("\t")
    runs[(k, tree)].append(float(seconds))
for (k, tree), values in sorted(runs.items()):
    print(f"# -k {k} {tree}: {', '.join(f'{v:.2f}' for v in values)}; median {statistics.median(values):.2f} s")
PY
cat "$work/runs" > "$out"
