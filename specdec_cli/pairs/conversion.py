"""A GGUF source converted once into a transformers directory under the cache, and checked when read.

The conversion holds what every start reads: the config, generation config and tokenizer, taken from
the GGUF's metadata in seconds. Its float32 weights (four times a Q4 file, and the whole float model
in memory while they are made) are added only when a command loads the model unquantised (a float
dtype, training's teacher at float32, a server that reads transformers directories): a quantised
target is prepared from the GGUF itself, one tensor at a time (layerwise.py, gguf_tensors.py).

The conversion records a sampled digest of every file (``DIGESTS``, runtime/sampled_digest.py), and
each reader checks the files it reads: the small ones at every start (a few pages, cheap), the
weights before they are read. A file that does not match is reported on one line and the conversion
made again. A conversion written before the digests existed has none, and is read unchecked.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import io
import json
import os
import shutil
from contextlib import contextmanager, redirect_stderr
from pathlib import Path

import numpy as np
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
    when ``weights``) and made again, with one warning, when damaged. ``weights``: with its float32
    weights, added now if it has none. Its staging directory is made before the work: a cache that
    cannot take the conversion, which every later start reads, is one line before the work, not a
    traceback after it."""
    target = open_cache() / cache_key(source, directory, gguf_file)
    if (target / "config.json").is_file():
        try:
            check(target, weights)
            if not weights or has_weights(target):
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
                _convert_once(source, directory, gguf_file, target, identity, weights)
            elif weights and not has_weights(target):
                _add_weights(source, directory, gguf_file, target)
    except OSError as exc:
        raise UserError(f"the conversion of {gguf_file}: {unwritable(target, exc)}") from None
    removed = superseded.remove_superseded(target.parent, target, identity)
    if removed:
        log.info(f"removed {len(removed)} conversion(s) of an earlier copy of {gguf_file} and their prepared targets")
    return str(target)


def _convert_once(source: ModelSource, directory: str, gguf_file: str, target: Path, identity: str,
                  weights: bool) -> None:
    with staging.staging(target.parent) as scratch:
        if target.exists():
            raise PermissionError(13, "a damaged conversion could not be removed", str(target))
        log.info(f"converting {gguf_file} once (later runs read {target})")
        with gguf_read_once():
            _convert(source, directory, gguf_file, scratch)
            if weights and not has_weights(scratch):
                _float_weights(source, directory, gguf_file, scratch)
        superseded.mark(scratch, identity)
        record(scratch)
        os.replace(scratch, target)  # atomic: a half-written conversion is never found


def has_weights(directory: Path) -> bool:
    """Whether a conversion holds its float weights."""
    return any(path.name.endswith(WEIGHTS_SUFFIX) for path in directory.iterdir())


def _add_weights(source: ModelSource, directory: str, gguf_file: str, target: Path) -> None:
    """The float32 weights added to the conversion ``target``: each weights file moved in whole, then
    the digests written again with theirs (a reader between the two reads a whole file, unchecked)."""
    log.info(f"converting {gguf_file}'s weights to float32 once, for a model loaded unquantised "
             f"(later runs read {target})")
    with staging.staging(target.parent) as scratch, gguf_read_once():
        _float_weights(source, directory, gguf_file, scratch)
        for path in sorted(scratch.iterdir()):
            os.replace(path, target / path.name)
    with staging.staging(target.parent) as scratch:
        record(target, scratch / DIGESTS)
        os.replace(scratch / DIGESTS, target / DIGESTS)


def record(directory: Path, into: Path | None = None) -> None:
    """Write the digest of every file in a finished conversion ``directory`` (to ``into``, else its own ``DIGESTS``)."""
    digests = {path.name: file_digest(path) for path in sorted(directory.iterdir())
               if path.is_file() and path.name != DIGESTS}
    (into or directory / DIGESTS).write_text(json.dumps(digests, indent=1) + "\n")


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
    """The GGUF's config, generation config and tokenizer as a transformers directory ``into``: the
    files ``save_pretrained`` of the whole model writes beside its weights, byte for byte (tested)."""
    quiet_transformers()
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        with redirect_stderr(io.StringIO()):
            tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
            config = AutoConfig.from_pretrained(directory, gguf_file=gguf_file)
    except (OSError, ValueError) as exc:
        raise UserError(f"could not load GGUF {source}: {first_line(exc)}") from None
    with torch.device("meta"):  # its class name and generation settings, no weights
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(into)
    model.generation_config.save_pretrained(into)
    tokenizer.save_pretrained(into)


@contextmanager
def gguf_read_once():
    """Within the block, transformers reads a GGUF's metadata once, through ``plain_reader``'s class,
    and gguf's map of tensor names once per architecture. Its config, AutoTokenizer (for the
    tokenizer's class) and the float weights' model each read all the metadata through gguf's reader,
    every vocabulary string included: most of a first run on a 262,144-token vocabulary
    (docs/notebook.md); and the weights' read builds the same name map again for each of the model's
    modules (some 400). Each metadata reader gets its own copy, as it got its own parse; a read of
    the tensors is not kept. The name map is only read."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_loading

    read, kept, reader, names = gguf_loading.load_gguf_checkpoint, {}, gguf.GGUFReader, gguf.get_tensor_name_map

    def once(path, return_tensors=False, **kwargs):
        if return_tensors or kwargs:
            return read(path, return_tensors, **kwargs)
        if path not in kept:
            kept[path] = read(path)
        return copy.deepcopy(kept[path])

    gguf_loading.load_gguf_checkpoint, gguf.GGUFReader = once, plain_reader(reader)
    gguf.get_tensor_name_map = functools.cache(names)
    try:
        yield
    finally:
        gguf_loading.load_gguf_checkpoint, gguf.GGUFReader, gguf.get_tensor_name_map = read, reader, names


def plain_reader(reader: type) -> type:
    """gguf's reader over a plain numpy view of its memory map: it slices one view per metadata element
    (a million for a 262,144-token vocabulary), and a ``np.memmap``'s slicing runs in Python, a plain
    array's in C. The fields and tensors are the same (tests/test_gguf_header.py)."""

    class PlainReader(reader):
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, mapped):  # the reader's __init__ maps the file here; the view keeps the map alive
            self._plain = mapped.view(np.ndarray)

    return PlainReader


def _float_weights(source: ModelSource, directory: str, gguf_file: str, into: Path) -> None:
    """The GGUF's float32 weights as transformers' conversion writes them (the whole float model in
    memory: only for a command that loads it so), their files alone into ``into``."""
    quiet_transformers()
    from transformers import AutoModelForCausalLM

    try:
        with redirect_stderr(io.StringIO()):  # the GGUF reader draws its own progress bar
            model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf_file, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise UserError(f"could not load GGUF {source}: {first_line(exc)}") from None
    # A GGUF-loaded model refuses save_pretrained while it remembers its quantizer; the weights
    # are already de-quantised, so forgetting it is exact.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with staging.staging(into) as saved:
        model.save_pretrained(saved)
        del model
        for path in saved.iterdir():
            if path.name.endswith(WEIGHTS_SUFFIX) or path.name.endswith(WEIGHTS_SUFFIX + ".index.json"):
                os.replace(path, into / path.name)


def gguf_path(source: ModelSource, directory: str, gguf_file: str) -> Path:
    """The GGUF file itself, to prepare a target from: a hub file from the hub's cache, where its
    conversion fetched it."""
    if source.kind != "hub":
        return Path(directory) / gguf_file
    from transformers.utils import cached_file

    return Path(cached_file(directory, gguf_file))


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
