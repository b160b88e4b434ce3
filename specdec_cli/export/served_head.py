"""The pair's draft head in an engine's EAGLE-3 layout, exported once into the cache for the servers
an engine bench or check starts (`vllm-eagle3:K`, `llama-eagle3:K`), keyed by the head's weights, the
engine and the exporting code: a head retrained, or a map changed, gets a new directory instead of a
stale one."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from ..pairs.cache_dir import cache_root


def key(head_dir: Path, engine: str = "vllm") -> str:
    """sha256 over the engine, the head's weights and metadata and the code that maps it (eagle3, head_export)."""
    from . import eagle3, head_export

    digest = hashlib.sha256(engine.encode())
    for path in (head_dir / "head.safetensors", head_dir / "specdec-draft.json",
                 Path(eagle3.__file__), Path(head_export.__file__)):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def eagle3_directory(head_dir: Path, progress: Callable[[str], None] = lambda line: None, engine: str = "vllm") -> Path:
    """The cached export of ``head_dir`` for ``engine``'s layer, written first when missing (into a
    temporary directory, renamed into place: a reader finds the whole export or none)."""
    from ..pairs.loading import load
    from ..pairs.registry import ModelSpec
    from ..pairs.sources import ModelSource
    from .head_export import export_head

    head_dir = Path(head_dir)
    final = cache_root() / "eagle3" / f"{head_dir.name}-{engine}-{key(head_dir, engine)}"
    if (final / "config.json").is_file() and (final / "model.safetensors").is_file():
        return final
    progress(f"exporting the draft head {head_dir} in {engine}'s EAGLE-3 layout to {final} (once)")
    final.parent.mkdir(parents=True, exist_ok=True)

    def load_target(source: str):
        loaded = load(ModelSpec(ModelSource.parse(source), dtype="float32", device_map="cpu"))
        return loaded.model, loaded.tokenizer

    scratch = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        export_head(head_dir, scratch / "out", "eagle3", load_target, engine=engine)
        try:
            (scratch / "out").rename(final)
        except OSError:  # another process wrote it first: theirs is as good
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final
