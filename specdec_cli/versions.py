"""Versions that a calibration depends on: the model files and the libraries that run them.

Recorded in the profile so that a stale calibration can be recognised (timings change with torch
and transformers releases, acceptance with the model files).
"""

from __future__ import annotations

import platform
from datetime import datetime, timezone
from importlib import metadata

from .errors import UserError
from .sources import ModelSource

LIBRARIES = ("specdec", "torch", "transformers", "accelerate")


def library_versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def source_version(source: ModelSource) -> str:
    """A package's version, a hub snapshot's commit, or a local file's size and modification time."""
    if source.kind == "package":
        package = source.location.partition("/")[0]
        for distribution in metadata.packages_distributions().get(package, []):
            return f"{distribution} {metadata.version(distribution)}"
    if source.kind == "hub":
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(source.location, source.gguf_file or "config.json")
        if isinstance(cached, str) and "/snapshots/" in cached:
            return "commit " + cached.split("/snapshots/")[1].split("/")[0]
        return "not cached"
    try:
        path = source.local_path()
    except UserError:
        return "missing"
    stat = path.stat()
    modified = datetime.fromtimestamp(stat.st_mtime, timezone.utc).isoformat(timespec="seconds")
    return f"{'file' if path.is_file() else 'directory'} modified {modified}" + (f", {stat.st_size} bytes" if path.is_file() else "")
