"""A GGUF source converted once into a transformers directory under the cache, and checked when read.

Converting takes tens of seconds (de-quantising every tensor); later runs read the directory. A warm
start that maps a prepared target reads only its small files (config, generation config, tokenizer);
its weights are read when a target is prepared from them or loaded unquantised. So the conversion
records a sampled digest of every file (``DIGESTS``, runtime/sampled_digest.py), and each reader checks
the files it reads: the small ones at every start (a few pages, cheap), the weights before they are
read. A file that does not match is reported on one line and the conversion made again. A conversion
written before the digests existed has none, and is read unchecked.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from contextlib import redirect_stderr
from pathlib import Path

import torch

from ..atomic import updating
from ..errors import UserError, first_line
from ..notices import log
from ..runtime import staging
from ..runtime.sampled_digest import file_digest
from . import superseded
from .cache_dir import open_cache, transformers_version, unwritable
from .quiet import quiet_transformers
from .sources import ModelSource

DIGESTS = "specdec-digests.json"
WEIGHTS_SUFFIX = ".safetensors"


class Damaged(Exception):
    """A conversion's file does not match its digest; the message names it."""


def converted(source: ModelSource, directory: str, gguf_file: str, weights: bool = True) -> str:
    """The conversion of ``directory/gguf_file``, made once and reused; checked first (its weights too
    when ``weights``) and made again, with one warning, when damaged. Its staging directory is made
    before the work: a cache that cannot take the conversion, which every later start reads, is one
    line before the work, not a traceback after it."""
    target = open_cache() / cache_key(source, directory, gguf_file)
    if (target / "config.json").is_file():
        try:
            check(target, weights)
            return str(target)
        except Damaged as exc:
            log.warning(f"the conversion of {gguf_file} is damaged ({exc}); converting it again")
            shutil.rmtree(target, ignore_errors=True)
    identity = gguf_identity(source, directory, gguf_file)
    try:
        # One process converts at a time: another that starts meanwhile waits for it and reads its
        # conversion, instead of de-quantising the same file beside it.
        with updating(target):
            if not (target / "config.json").is_file():
                _convert_once(source, directory, gguf_file, target, identity)
    except OSError as exc:
        raise UserError(f"the conversion of {gguf_file}: {unwritable(target, exc)}") from None
    removed = superseded.remove_superseded(target.parent, target, identity)
    if removed:
        log.info(f"removed {len(removed)} conversion(s) of an earlier copy of {gguf_file} and their prepared targets")
    return str(target)


def _convert_once(source: ModelSource, directory: str, gguf_file: str, target: Path, identity: str) -> None:
    with staging.staging(target.parent) as scratch:
        if target.exists():
            raise PermissionError(13, "a damaged conversion could not be removed", str(target))
        log.info(f"converting {gguf_file} once (later runs read {target})")
        _convert(source, directory, gguf_file, scratch)
        superseded.mark(scratch, identity)
        record(scratch)
        os.replace(scratch, target)  # atomic: a half-written conversion is never found


def record(directory: Path) -> None:
    """Write the digest of every file in a finished conversion ``directory``."""
    digests = {path.name: file_digest(path) for path in sorted(directory.iterdir()) if path.is_file()}
    (directory / DIGESTS).write_text(json.dumps(digests, indent=1) + "\n")


def check(directory: str | Path, weights: bool) -> None:
    """``Damaged`` when a file of the conversion ``directory`` (its weights only when ``weights``) does
    not match the digest written with it; a directory without digests is not checked."""
    directory = Path(directory)
    try:
        digests = json.loads((directory / DIGESTS).read_text())
    except FileNotFoundError:
        return
    except (OSError, ValueError) as exc:
        raise Damaged(f"{DIGESTS} does not read: {exc}") from None
    if not isinstance(digests, dict):
        raise Damaged(f"{DIGESTS} is not a mapping")
    for name, digest in digests.items():
        if name.endswith(WEIGHTS_SUFFIX) and not weights:
            continue
        try:
            found = file_digest(directory / name)
        except OSError as exc:
            raise Damaged(f"{name}: {exc.strerror or exc}") from None
        if found != digest:
            raise Damaged(f"{name} does not match its digest")


def _convert(source: ModelSource, directory: str, gguf_file: str, into: Path) -> None:
    """Load the GGUF (de-quantising every tensor) and save it as a transformers directory ``into``."""
    quiet_transformers()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with redirect_stderr(io.StringIO()):  # the GGUF reader draws its own progress bar
            tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
            model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf_file, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise UserError(f"could not load GGUF {source}: {first_line(exc)}") from None
    # A GGUF-loaded model refuses save_pretrained while it remembers its quantizer; the weights
    # are already de-quantised, so forgetting it is exact.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(into)
    tokenizer.save_pretrained(into)


def gguf_identity(source: ModelSource, directory: str, gguf_file: str) -> str:
    """Which GGUF file a conversion is of, whatever copy of it (superseded.py)."""
    return f"{source.location}#{gguf_file}" if source.kind == "hub" else str(Path(directory).resolve() / gguf_file)


def cache_key(source: ModelSource, directory: str, gguf_file: str) -> str:
    if source.kind == "hub":
        identity = f"{source.location}#{gguf_file}"
    else:
        stat = (Path(directory) / gguf_file).stat()
        identity = f"{Path(directory).resolve() / gguf_file}:{stat.st_size}:{stat.st_mtime_ns}"
    digest = hashlib.sha256(f"{identity}|transformers {transformers_version()}".encode()).hexdigest()[:12]
    return f"{Path(gguf_file).stem}-{digest}"
