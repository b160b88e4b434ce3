"""A target's architecture from its files, read without torch, for `specdec models` to say which
forward a pair runs before loading it: a directory's config.json, a hub model's cached one, or a GGUF's
``general.architecture``.

The gguf package's reader parses every field and tensor of the file first (seconds for a 262k-token
vocabulary), so the key is read from the header itself: GGUF files put ``general.architecture``
first (the gguf package's writer and llama.cpp's converter both do), and a file that does not is
"unknown", never guessed.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace

from ..errors import UserError
from ..runtime.lean_architectures import GGUF_TYPES, refusal
from .chunked_package import joined_path
from .sources import ModelSource

GGUF_STRING = 8  # the value type of a string in a GGUF key/value
QUANTISED_DTYPES = ("int8", "int4", "gguf")  # the lean forward runs quantised targets only


def gguf_architecture(path: Path) -> str | None:
    """The first key/value of a GGUF header when it is ``general.architecture``, else None."""
    try:
        with open(path, "rb") as file:
            head = file.read(4096)
    except OSError:
        return None
    if head[:4] != b"GGUF" or len(head) < 32:
        return None
    at = 24  # magic, version (u32), tensor count and key/value count (u64 each)
    (length,) = struct.unpack_from("<Q", head, at)
    key = head[at + 8 : at + 8 + length]
    at += 8 + length
    if key != b"general.architecture" or len(head) < at + 12:
        return None
    kind, size = struct.unpack_from("<IQ", head, at)
    return head[at + 12 : at + 12 + size].decode(errors="replace") if kind == GGUF_STRING else None


def target_config(source: ModelSource) -> SimpleNamespace | None:
    """The fields of the target's config.json that say its architecture, where its files are here
    (a GGUF gives its model type only); None where they are not."""
    path = files_here(source)
    if path is None:
        return None
    if path.name == "config.json" or path.is_dir():
        return _config(path if path.is_file() else path / "config.json")
    architecture = gguf_architecture(path)
    return SimpleNamespace(model_type=GGUF_TYPES.get(architecture, architecture)) if architecture else None


def files_here(source: ModelSource) -> Path | None:
    """The target's directory, GGUF file or cached config.json on this machine, without fetching or
    joining anything; None where it is not here yet."""
    if source.kind == "hub":
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(source.location, source.gguf_file or "config.json")
        return Path(found) if isinstance(found, str) else None
    if source.kind == "package" and source.chunked() is not None:
        joined = joined_path(*source.location.split("/", 1))
        return joined if joined.is_file() else None
    try:
        return source.local_path()
    except UserError:
        return None


def _config(path: Path) -> SimpleNamespace | None:
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return SimpleNamespace(**values) if isinstance(values, dict) else None


def forward_of(source: ModelSource, dtype: str) -> str:
    """``lean``, ``transformers``, or ``unknown`` (its files are not here yet)."""
    if dtype not in QUANTISED_DTYPES:
        return "transformers"
    config = target_config(source)
    if config is None:
        return "unknown"
    return "lean" if refusal(config) is None else "transformers"
