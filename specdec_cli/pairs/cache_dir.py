"""Where specdec keeps what it makes once (GGUF conversions, prepared targets, block costs, vLLM's
environment and logs): ``$SPECDEC_CACHE``, else ``specdec/`` in Hugging Face's cache home, computed as
huggingface_hub computes it (``$HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else
``~/.cache/huggingface``) but without importing it. install.sh computes the same path; keep the two in step.

``open_cache`` is the cache as the model loaders use it: checked once a process (a path that is not a
directory is one line, before any work) and rid of what killed writers left (staging.py)."""

from __future__ import annotations

import os
from functools import cache
from importlib.metadata import version
from pathlib import Path

from ..errors import UserError
from ..runtime import staging


def cache_root() -> Path:
    if os.environ.get("SPECDEC_CACHE"):
        return Path(os.environ["SPECDEC_CACHE"]).expanduser()
    hf_home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(hf_home).expanduser() / "specdec"


def open_cache() -> Path:
    """``cache_root``, refused when it cannot be a directory, its leftovers swept (once a process)."""
    return _opened(cache_root())


@cache
def _opened(root: Path) -> Path:
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = f" ({existing} is not one)" if existing != root else ""
        raise UserError(f"the specdec cache {root} is not a directory{where}: set SPECDEC_CACHE to a directory you can write")
    for directory in (root, kernels_directory(root)):
        staging.sweep(directory)
    return root


def kernels_directory(root: Path) -> Path:
    """Where the compiled kernels live (runtime/native_kernels.library_path's rule, without hashing their sources)."""
    return Path(os.environ["SPECDEC_KERNELS"]).expanduser() if os.environ.get("SPECDEC_KERNELS") else root / "kernels"


def unwritable(path: Path, exc: OSError) -> str:
    """The one line for an entry that cannot be written: where, why, and what to do."""
    return f"cannot write {path} ({exc.strerror or exc}): set SPECDEC_CACHE to a directory you can write"


@cache
def transformers_version() -> str:
    """The transformers release the cached files were made under (conversions, prepared targets and
    block costs are keyed by it), from its installed metadata: importing transformers to ask costs a second."""
    return version("transformers")
