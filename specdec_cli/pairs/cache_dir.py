"""Where specdec keeps what it makes once (GGUF conversions, prepared targets, block costs, vLLM's
environment and logs): ``$SPECDEC_CACHE``, else ``specdec/`` in Hugging Face's cache home, computed as
huggingface_hub computes it (``$HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``, else
``~/.cache/huggingface``) but without importing it. install.sh computes the same path; keep the two in step."""

from __future__ import annotations

import os
from functools import cache
from importlib.metadata import version
from pathlib import Path


def cache_root() -> Path:
    if os.environ.get("SPECDEC_CACHE"):
        return Path(os.environ["SPECDEC_CACHE"]).expanduser()
    hf_home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(hf_home).expanduser() / "specdec"


@cache
def transformers_version() -> str:
    """The transformers release the cached files were made under (conversions, prepared targets and
    block costs are keyed by it), from its installed metadata: importing transformers to ask costs a second."""
    return version("transformers")
