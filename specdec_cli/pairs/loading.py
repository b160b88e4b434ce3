"""Loading models and tokenizers from a ``ModelSpec``, with converted GGUF files cached on disk.

A GGUF's config and tokenizer are converted once under the cache directory (``$SPECDEC_CACHE``, else
``$HF_HOME/specdec``; conversion.py), its float weights only for a model loaded unquantised; a
quantised target is prepared from the GGUF a tensor at a time (layerwise.py) and mapped from its
prepared file afterwards. Placement goes through accelerate's ``device_map``, so a target too
large for one device can be spread or offloaded while the same code runs on a CPU-only machine.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..atomic import updating
from ..errors import UserError, first_line
from ..notices import log
from ..runtime import dense_prefill, gguf_linears, native_kernels, prepared_file
from ..runtime.computed_by import computed_by
from ..runtime.lean_architectures import refusal
from ..runtime.lean_install import use_lean_forward
from ..runtime.lean_model import LeanCausalLM, lean_config, lean_generation_config
from ..runtime.quantize import QUANTISED
from ..runtime.rowwise_attention import use_rowwise_attention
from . import conversion, superseded
from .gguf_tensors import gguf_tensors
from .layerwise import Progress, prepared_by_layer
from .cache_dir import open_cache, transformers_version, unwritable
from .lean_tokenizer import LeanTokenizer, NotLean
from .quiet import quiet_transformers
from .registry import ModelSpec
from .sources import ModelSource

if TYPE_CHECKING:  # transformers' modeling code is imported only where a model of its own is built
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: ModelSource
    files: Path | None  # the directory the weights were read from, when local
    precision: str = ""  # the dtype it was asked for

    def computed_by(self) -> dict:
        """Its kernels, their CPU path, its prompts' precision and the threads now (runtime/computed_by.py)."""
        return computed_by(self.model)


def load(spec: ModelSpec, lean: bool = False, accept: Callable | None = None) -> LoadedModel:
    """``lean``: a prepared int8/int4 Llama target may come without transformers (runtime/lean_model.py,
    ``target_tokenizer``), for a command that only decodes: a call its lean forward does not run is refused.
    ``accept``: called with the tokenizer before the model is built, to refuse it (a draft whose ids
    differ from the target's) before its int4 copy is prepared into the cache."""
    source_directory, gguf_file = _resolve(spec.source)
    if spec.dtype == "gguf" and not gguf_file:
        raise UserError(gguf_linears.not_gguf(spec.source))
    quantised = spec.dtype in QUANTISED
    directory, original = source_directory, None
    if gguf_file:  # a quantised target is prepared from the GGUF itself: its conversion holds no float weights
        directory = conversion.converted(spec.source, source_directory, gguf_file, weights=not quantised)
        original = conversion.gguf_path(spec.source, source_directory, gguf_file) if quantised else None
    elif spec.source.local_path() is not None:
        _check_files(Path(directory))
    try:
        tokenizer = load_tokenizer(directory) if accept else None
        if accept:
            accept(tokenizer)
        if quantised:
            model = quantised_target(spec, directory, original, lean)
        else:
            model = quiet_transformers().AutoModelForCausalLM.from_pretrained(directory, dtype=_dtype(spec.dtype),
                                                                              device_map=spec.device_map)
        if tokenizer is None:
            tokenizer = target_tokenizer(directory, lean, isinstance(model, LeanCausalLM))
    except (OSError, ValueError) as exc:
        raise UserError(f"could not load {spec.source}: {first_line(exc)}") from None
    files = Path(directory) if spec.source.kind != "hub" else None
    precision = str(model.dtype).removeprefix("torch.") if spec.dtype == "auto" else spec.dtype
    return LoadedModel(model.eval(), tokenizer, spec.source, files, precision)


def transformers_directory(source: ModelSource) -> Path:
    """The model as a transformers directory on disk, for a program that cannot read GGUF (a vLLM
    server on a CPU): a GGUF source's converted cache directory (made once), else its own directory."""
    directory, gguf_file = _resolve(source)
    if gguf_file:
        return Path(conversion.converted(source, directory, gguf_file))
    if source.local_path() is None:
        raise UserError(f"{source} is a hub id; give a local model directory or a .gguf file")
    _check_files(Path(directory))
    return Path(directory)


def gguf_file(source: ModelSource, why: str) -> Path:
    """The GGUF file a source names, for a program that reads GGUF itself (llama.cpp's server)."""
    directory, name = _resolve(source)
    if not name or source.local_path() is None:
        raise UserError(f"{why}, and {source} is not a local .gguf file: give the pair a GGUF target (--target FILE.gguf)")
    return Path(directory) / name


def target_tokenizer(directory: str, lean: bool,
                     without_transformers: bool) -> LeanTokenizer | PreTrainedTokenizerBase:
    """A command that only decodes (``lean``) reads the tokenizer with the `tokenizers` library alone
    where the files allow (pairs/lean_tokenizer.py: the same ids and text): a target loaded without
    transformers then starts without it, and a large vocabulary loads in a second, not in several.
    Where the files do not allow it, transformers' is loaded, and for a target ``without_transformers``
    a notice says why, since that import is then about a second of every start."""
    if lean:
        try:
            return LeanTokenizer.from_directory(directory)
        except NotLean as exc:
            if without_transformers:
                log.info(f"the tokenizer loads through transformers, about a second more at every start: {exc}")
    return load_tokenizer(directory)


def load_tokenizer(directory: str) -> PreTrainedTokenizerBase:
    """The model's tokenizer. One whose files name transformers' tokenizers backend is built as that
    class directly: what AutoTokenizer builds, without importing transformers' model registry."""
    try:
        declared = json.loads((Path(directory) / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        declared = None
    quiet_transformers()
    if declared == "TokenizersBackend" and (Path(directory) / "tokenizer.json").is_file():
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(directory)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def quantised_target(spec: ModelSpec, directory: str, gguf_path: Path | None,
                     lean_model: bool = False) -> PreTrainedModel:
    """The int8/int4 target (``_quantised``), mapped from its prepared file under the cache directory
    when one was written for this source, dtype and code (runtime/prepared_file.py), else built and saved
    there; an unusable file is reported on one line and built again, never used. ``lean_model``: a
    Llama comes as runtime/lean_model.py's skeleton, without transformers' model.

    One process prepares at a time (the cache directory's lock, as for a conversion): another that
    needs the same target meanwhile waits, then maps what the first wrote, instead of spending a
    whole preparation's time and writes on the same file beside it."""
    lean = os.environ.get("SPECDEC_LEAN_FORWARD") != "0"
    native = native_kernels.available(open_cache())
    if spec.dtype == "gguf" and not native:
        raise UserError(gguf_linears.NO_KERNELS)
    dense_dtype = dense_prefill.dense_dtype(native_kernels.cpu_path() if native else "") if lean else None
    key = _prepared_key(spec, directory, gguf_path, dense_dtype, native)
    path = _prepared_path(key, Path(directory).name) if key else None
    if path is None:
        return _finish(*_built(spec, directory, gguf_path, dense_dtype, native), lean)
    seen = _stamp(path)
    model = _mapped(path, key, directory, lean, lean_model) if seen is not None else None
    if model is not None:
        return model
    with updating(path):
        now = _stamp(path)
        if now is not None and now != seen:  # written by another process while this one waited
            model = _mapped(path, key, directory, lean, lean_model)
            if model is not None:
                return model
        model, dense = _built(spec, directory, gguf_path, dense_dtype, native, path)
        _keep(path, model, dense, key)
        return _finish(model, dense, lean)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What tells the file at ``path`` from another (inode, size, modification time), None when there is
    none: a file replaced while a process waited for the lock is another."""
    try:
        found = path.stat()
    except FileNotFoundError:
        return None
    return found.st_ino, found.st_size, found.st_mtime_ns


def _mapped(path: Path, key: str, directory: str, lean: bool, lean_model: bool) -> PreTrainedModel | None:
    """The target mapped from its prepared file, or None with one warning when the file is unusable."""
    try:
        tensors, layout = prepared_file.read(path, key)
        dense = prepared_file.dense_copies(tensors, layout)
        config = lean_config(directory) if lean and lean_model else None
        model = _lean_skeleton(config, directory, tensors, layout) if config is not None else None
        if model is not None and use_lean_forward(model, dense):
            return model
        return _finish(prepared_file.assemble(_skeleton(directory), tensors, layout), dense, lean)
    except prepared_file.Unusable as exc:
        log.warning(f"the prepared target is unusable ({first_line(exc)}); preparing it again")
        return None


def _built(spec: ModelSpec, directory: str, gguf_path: Path | None, dense_dtype, native: bool,
           path: Path | None = None) -> tuple[PreTrainedModel, list | None]:
    """The target quantised from its weights, and its dense prompt copies; ``path``: where it is to be
    kept (a large one says so, and how far it is, as it takes a while). A GGUF target is read from
    the GGUF one tensor at a time into a skeleton (layerwise.py), never as a whole float model."""
    if gguf_path is not None:
        model = _skeleton(directory, empty=True)
        tensors = gguf_tensors(gguf_path, model)
    else:
        transformers = quiet_transformers()
        # on the CPU: the kernels are CPU kernels
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, device_map="cpu")
        tensors = ()
    progress = None
    if path is not None and sum(p.numel() for p in model.parameters()) >= SLOW_TO_PREPARE:
        log.info(f"preparing the {spec.dtype} target once (later runs map it from {path})")
        progress = Progress(f"preparing the {spec.dtype} target")
    return _quantised(model, tensors, spec.dtype, dense_dtype, native, progress)


def _keep(path: Path, model, dense, key: str) -> None:
    """Save the prepared target and remove its stale copies; where the cache cannot take it (read-only,
    full, another user's), the target runs from memory and one warning says what that costs."""
    try:
        prepared_file.save(path, model, dense, key)
    except OSError as exc:
        log.warning(f"the prepared target is not kept, so it is prepared again at every start: {unwritable(path, exc)}")
        return
    for stale in prepared_file.files(path.parent, f"{path.name.rsplit('-', 1)[0]}-"):
        if stale != path:  # the same source, dtype and copies under older code: never read again
            with suppress(OSError):  # another user's, in a shared cache: theirs to remove
                stale.unlink(missing_ok=True)


def _prepared_path(key: str, name: str) -> Path:
    """prepared-NAME-SOURCE-CODE.pt: SOURCE digests the key's fields but the code's (the last), so
    that a file written under older code for the same source is found and removed."""
    source = key.rsplit("|", 2)[0]  # the code digest and the library version are the key's last fields
    name = superseded.prepared_name(name)
    return open_cache() / f"prepared-{name}-{_short(source)}-{_short(key)}{prepared_file.SUFFIX}"


def _short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


SLOW_TO_PREPARE = 20_000_000  # parameters: a smaller target is prepared in well under a second, silently


def _prepared_key(spec: ModelSpec, directory: str, gguf_path: Path | None, dense_dtype, native: bool) -> str | None:
    """What a prepared file must have been written under: the source's fingerprint (a GGUF's converted
    directory is named by its own; a local directory's files by size and time), the dtype, the prompt
    copies' dtype and the code; None for a hub repository, whose files are not here to fingerprint."""
    if gguf_path is not None or spec.source.is_gguf:
        identity = Path(directory).name
    elif spec.source.local_path() is not None:
        root = Path(directory).resolve()
        files = sorted(p for pattern in ("config.json", *WEIGHTS) for p in root.glob(pattern))
        identity = f"{root}:" + ",".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
    else:
        return None
    kernel = "q8" if native else "torch"
    return "|".join([identity, spec.dtype, str(dense_dtype), kernel, prepared_file.code_digest(),
                     transformers_version()])


def _lean_skeleton(config, directory: str, tensors: dict, layout: dict) -> LeanCausalLM | None:
    """runtime/lean_model.py's skeleton filled with the prepared tensors; None where they do not fit it
    (a linear the file keeps in floats, which the lean forward does not run either): transformers'
    skeleton takes them, and the load says which forward runs (a damaged file fits neither)."""
    try:
        return prepared_file.assemble(LeanCausalLM(config, lean_generation_config(directory, config)), tensors,
                                      layout).eval()
    except prepared_file.Unusable:
        return None


def _generation_config(directory: str, config):
    """transformers' GenerationConfig: generation_config.json, else what from_pretrained derives from the
    model's config."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(directory)
    except OSError:
        return GenerationConfig.from_model_config(config)


def _skeleton(directory: str, empty: bool = False) -> PreTrainedModel:
    """The float model's structure without its weights (meta device), with its generation settings;
    ``empty``: its parameters alone on the meta device, its buffers (rotary frequencies) computed, to
    be filled with weights (layerwise.py)."""
    quiet_transformers()
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(directory)
    with init_empty_weights(include_buffers=False) if empty else torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = _generation_config(directory, config)
    return model


def _finish(model: PreTrainedModel, dense, lean: bool) -> PreTrainedModel:
    use_rowwise_attention(model)
    if lean and not use_lean_forward(model, dense):
        why = refusal(model.config) or "not all of its layers are ones the lean forward computes"
        log.info(f"this {model.config.model_type} target runs transformers' forward with specdec's linears inside, "
                 f"not specdec's lean one (slower per token): {why}")
    return model


def _quantised(model: PreTrainedModel, tensors, kind: str, dense_dtype, native: bool,
               progress=None) -> tuple[PreTrainedModel, list | None]:
    """Weight-only int8/int4 linears in a model that otherwise stays float32: on specdec's kernel
    (``native``: int8 activation codes, float32 in and out, runtime/native_kernels.py), else on torch's,
    which take and give bfloat16 (float32 inputs take their slow paths, several times slower). Norms,
    attention and residuals in float32 are faster on a CPU than in bfloat16 and do not depend on the
    block length, while the kernels give each row the same result at any block length, so a verify
    block scores exactly as one-token forwards do. A GGUF's own blocks go in as they are where the dtype
    keeps them (int4: 4-bit ones; gguf: every format, gguf_linears.py). ``model``'s weights still on the
    meta device come from ``tensors``, a layer at a time (layerwise.py). A target of an architecture it
    covers then runs the lean forward (lean_forward.py: transformers' ops, bit for bit, without its
    dispatch; runtime/lean_architectures.py); ``SPECDEC_LEAN_FORWARD=0`` keeps transformers' forward.
    A Llama's prompts run on dense copies of the float weights: bfloat16 where this CPU multiplies it
    fast, else float32 (dense_prefill.py)."""
    return prepared_by_layer(model, tensors, kind, dense_dtype, native, progress)


def _resolve(source: ModelSource) -> tuple[str, str | None]:
    """(directory or hub id, GGUF file name inside it or None)."""
    path = source.local_path()
    if path is None:
        return source.location, source.gguf_file
    if path.is_file():
        if not source.is_gguf:
            raise UserError(f"{path} is a file but not a .gguf; give a model directory or a GGUF file")
        return str(path.parent), path.name
    return str(path), None


WEIGHTS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
TOKENIZER = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt")


def _check_files(directory: Path) -> None:
    """Name what a model directory lacks, rather than let the tokenizer's loader fail half-way
    through a sentence about backends."""
    missing = []
    if not (directory / "config.json").is_file():
        missing.append("config.json")
    if not any(any(directory.glob(pattern)) for pattern in WEIGHTS):
        missing.append("weights (model.safetensors or pytorch_model.bin)")
    if not any((directory / name).is_file() for name in TOKENIZER):
        missing.append("a tokenizer (tokenizer.json or tokenizer.model)")
    if missing:
        ggufs = sorted(path.name for path in directory.glob("*.gguf"))
        hint = f"; it holds {ggufs[0]}: give that file instead" if ggufs else ""
        raise UserError(f"{directory} is not a model directory: missing {', '.join(missing)}{hint}")


def _dtype(name: str):
    return "auto" if name == "auto" else getattr(torch, name)
