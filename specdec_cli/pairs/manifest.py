"""What a measurement was made with: model files, library versions, machine, threads, seeds.

A speed figure without these cannot be compared with another one, and a calibration profile
records them so that a stale one can be recognised (timings change with torch and transformers
releases, acceptance with the model files).
"""

from __future__ import annotations

import hashlib
import json
import platform
from datetime import datetime, timezone
from importlib import metadata
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from ..errors import UserError
from .loading import LoadedModel
from .sources import ModelSource

LIBRARIES = ("specdec", "torch", "transformers", "accelerate", "tokenizers")


def file_hashes(model: LoadedModel) -> dict[str, str]:
    """sha256 of the weight files the model was read from (hub models: the source id only)."""
    if model.files is None:
        return {}
    paths = sorted(Path(model.files).glob("*.safetensors")) + sorted(Path(model.files).glob("*.bin"))
    return {path.name: sha256(path) for path in paths}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def model_entry(model: LoadedModel) -> dict:
    return {"source": str(model.source), "files": file_hashes(model), "dtype": model.precision or str(model.model.dtype)}


def head_entry(directory: Path) -> dict:
    """A draft head: where it is, the hash of its weights, and the target it was trained for."""
    weights = Path(directory) / "head.safetensors"
    meta = json.loads((Path(directory) / "specdec-draft.json").read_text())
    return {"head": str(directory), "files": {weights.name: sha256(weights)}, "target": meta.get("target")}


def libraries() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
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


def machine() -> dict:
    return {
        "cpu": cpu_name(),
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
