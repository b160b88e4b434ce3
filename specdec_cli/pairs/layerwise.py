"""A quantised target prepared one decoder layer at a time, so that a first run needs the prepared
target's memory and one layer's float weights, never the whole float model.

The model's skeleton is built with its parameters on the meta device (its buffers, the rotary
frequencies, are computed as usual). Its weights arrive one tensor at a time (a GGUF's, de-quantised
by gguf_tensors.py); as soon as a decoder layer has all of them, the layer is prepared exactly as the
whole model used to be (its dense prompt copies taken, its linears quantised and fused by
quantize.quantise_model, a GGUF's own 4-bit blocks matched to its rows by gguf_int4.py; at ``gguf``
every tensor's own blocks, by gguf_blocks.py and gguf_linears.py) and its float
weights are let go. What is outside the layers (embeddings, final norm, output layer) is prepared
last, by the same call. Every step is per layer or per tensor, so the result is the whole model's,
bit for bit (tested against the old whole-model build).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterable
from functools import cache, partial

import torch
from torch import nn

from ..notices import log
from ..runtime import dense_prefill, gguf_blocks
from ..runtime.block_embedding import BlockEmbedding
from ..runtime.gguf_int4 import Q4_KINDS, matched_blocks
from ..runtime.gguf_linears import quantise_file_precision
from ..runtime.quantize import fits_int4, quantise_model

NOTICE_EVERY_S = 10.0


def prepared_by_layer(model: nn.Module, tensors: Iterable, kind: str, dense_dtype, native: bool,
                      progress: Callable[[int, int], None] | None = None) -> tuple[nn.Module, list | None]:
    """``model`` (parameters on the meta device, or already loaded) quantised to ``kind`` in place
    from ``tensors`` (objects with ``name``, ``value``, and ``gguf_name``/``kind``/``raw`` for a
    GGUF's blocks), and its dense prompt copies per layer (None where there are none). ``progress``
    is told (layers done, layers) as each is finished. ValueError when a weight never arrives.
    ``model.tensor_formats`` records the format each GGUF tensor's linear runs in (gguf_blocks.format_counts);
    at ``int4`` one notice names the GGUF formats that were re-quantised to int4."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    layers = list(layers) if isinstance(layers, nn.ModuleList) else []
    dense = [] if dense_dtype is not None and getattr(model.config, "model_type", None) == "llama" and layers else None
    awaited = [{f"{PREFIX}{i}.{name}" for name, tensor in _held(layer) if tensor.is_meta}
               for i, layer in enumerate(layers)]
    blocks: dict[str, tuple] = {}
    formats: dict[str, str] = {}
    requantised: dict[str, str] = {}  # linear -> the GGUF format int4 re-quantised
    quantise = quantise_file_precision if kind == "gguf" else partial(quantise_model, kind=kind, native=native)
    in_blocks = False  # the token embedding in its file's blocks (block_embedding.py)
    done = 0

    def finish_ready() -> None:
        nonlocal done
        while done < len(layers) and not awaited[done]:
            layer, inner = layers[done], f"{PREFIX}{done}."
            if dense is not None:
                dense.append(dense_prefill.dense_layer_weights(layer, dense_dtype))
            own = {name[len(inner):]: blocks.pop(name) for name in [n for n in blocks if n.startswith(inner)]}
            quantise(layer, blocks=own)
            del own
            _give_back()
            done += 1
            if progress is not None:
                progress(done, len(layers))

    finish_ready()
    for tensor in tensors:
        _put(model, tensor.name, tensor.value)
        layer = _layer_of(tensor.name, len(layers))
        if layer is not None:
            awaited[layer].discard(tensor.name)
        linear = _linear_of(model, tensor)
        if linear is not None:
            matched = _kept(tensor, linear, kind) and _match(model, tensor, linear, kind, blocks)
            formats[linear] = tensor.kind if matched else _runs_as(model, linear, kind)
            if not matched and kind == "int4":
                requantised[linear] = tensor.kind
            if matched and dense is None and layer is not None:
                _drop_weight(model, linear)  # its blocks are what the kernel takes
        if getattr(tensor, "gguf_name", None) == EMBEDDING:
            in_blocks = _embedding_in_blocks(model, tensor, quantise, blocks)
        del tensor
        _give_back()
        finish_ready()
    if getattr(model.config, "tie_word_embeddings", False) and not in_blocks:
        model.tie_weights()
    missing = sorted(set().union(*awaited[done:])) + [name for name, tensor in _held(model) if tensor.is_meta
                                                      and _layer_of(name, len(layers)) is None]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ValueError(f"the weights lack {missing[0]}{more}")
    quantise(model, blocks=blocks)  # what is left: the output layer
    _give_back()
    model.tensor_formats = formats
    _tell_requantised(requantised)
    return model, dense


PREFIX = "model.layers."  # where a decoder's layers are, in transformers' Llama-family models


def _layer_of(name: str, layers: int) -> int | None:
    """The decoder layer a weight's name is in, or None for one outside the layers."""
    if not name.startswith(PREFIX):
        return None
    index = name[len(PREFIX):].split(".", 1)[0]
    return int(index) if index.isdigit() and int(index) < layers else None


def _held(module: nn.Module):
    yield from module.named_parameters()
    yield from module.named_buffers()


def _put(model: nn.Module, name: str, value: torch.Tensor) -> None:
    """``value`` (float32, as from_pretrained loads it) in the place of the parameter or buffer ``name``;
    a name the model has no place for is skipped, as from_pretrained skips it."""
    owner, _, attr = name.rpartition(".")
    try:
        module = model.get_submodule(owner)
    except AttributeError:
        return
    value = value.to(torch.float32) if value.is_floating_point() else value
    if attr in module._parameters:
        module._parameters[attr] = nn.Parameter(value, requires_grad=False)
    elif attr in module._buffers:
        module._buffers[attr] = value


KEPT = {"int4": Q4_KINDS, "gguf": gguf_blocks.FORMATS}  # the GGUF formats each dtype runs as the file holds them


def _linear_of(model: nn.Module, tensor) -> str | None:
    """The linear a GGUF tensor is the weight of: a layer's projection, the output layer, or the output
    layer tied to the token embeddings; None for any other tensor (and for one not from a GGUF)."""
    gguf_name = getattr(tensor, "gguf_name", None)
    if gguf_name == "token_embd.weight" and getattr(model.config, "tie_word_embeddings", False):
        return "lm_head" if isinstance(getattr(model, "lm_head", None), nn.Linear) else None
    linear = gguf_blocks.module_name(gguf_name) if gguf_name else None
    return linear if linear is not None and f"{linear}.weight" == tensor.name else None


def _kept(tensor, linear: str, kind: str) -> bool:
    """Whether ``kind`` runs this GGUF tensor's own blocks: int4 its Q4 blocks (an output layer tied to
    the embeddings is quantised from float, as before), ``gguf`` every format gguf_blocks decodes."""
    if tensor.raw is None or tensor.kind not in KEPT.get(kind, ()):
        return False
    return kind == "gguf" or tensor.name == f"{linear}.weight"


def _match(model: nn.Module, tensor, linear: str, kind: str, blocks: dict) -> bool:
    """A GGUF tensor's own blocks, kept for its linear where they match its float weight exactly:
    (q, scale, minimum) for int4's Q4 blocks, gguf_blocks.FileBlocks for ``gguf``."""
    tied = linear == "lm_head" and tensor.name != "lm_head.weight"  # the embeddings' value is the output layer's
    weight = tensor.value if tied else model.get_submodule(linear).weight
    match = gguf_blocks.matched if kind == "gguf" else matched_blocks
    found = match(tensor.raw, tensor.kind, weight)
    if found is not None:
        blocks[linear] = found
    return found is not None


EMBEDDING = "token_embd.weight"


def _exact_blocks(tensor) -> bool:
    """Whether a GGUF tensor's blocks are in a format gguf_blocks decodes and their values are its float
    table exactly (decoded a slice of rows at a time, so no whole decoded copy is made to check)."""
    if tensor.raw is None or tensor.kind not in gguf_blocks.FORMATS:
        return False
    rows = gguf_blocks.ROWS_AT_ONCE
    for i in range(0, tensor.value.shape[0], rows):
        part = gguf_blocks.decode(tensor.raw[i : i + rows], tensor.kind)
        if part.codes.shape != tensor.value[i : i + rows].shape or not torch.equal(part.values(), tensor.value[i : i + rows]):
            return False
    return tensor.raw.shape[0] == tensor.value.shape[0]


def _embedding_in_blocks(model: nn.Module, tensor, quantise: Callable, blocks: dict) -> bool:
    """The token embedding in its file's blocks as soon as it arrives (block_embedding.py), where they
    are its float table exactly: a tied output layer is prepared from the table first, as the end of a
    build would prepare it, and the table is let go before any layer's weights arrive. No float copy
    is kept: output_weight de-quantises the table again when a draft head asks for it."""
    if not _exact_blocks(tensor):
        return False
    if getattr(model.config, "tie_word_embeddings", False) and isinstance(getattr(model, "lm_head", None), nn.Linear):
        holder = nn.Module()  # the output layer alone, so that nothing else is quantised with it
        holder.lm_head = model.lm_head
        holder.lm_head.weight = nn.Parameter(tensor.value, requires_grad=False)
        quantise(holder, blocks={"lm_head": blocks.pop("lm_head")} if "lm_head" in blocks else {})
        model.set_output_embeddings(holder.lm_head)
        _give_back()
    found = gguf_blocks.decode(tensor.raw, tensor.kind)
    model.set_input_embeddings(BlockEmbedding.from_blocks(found, model.get_input_embeddings()))
    return True


def _runs_as(model: nn.Module, linear: str, kind: str) -> str:
    """The format a linear without its file's blocks runs in: float32 at ``gguf``, else as quantised."""
    if kind == "gguf":
        return "F32"
    return "int4" if kind == "int4" and fits_int4(model.get_submodule(linear).in_features) else "int8"


def _tell_requantised(requantised: dict[str, str]) -> None:
    """One notice naming the GGUF formats whose tensors int4 re-quantised (each finer than, or not
    the same as, specdec's int4 groups): the precision lost, and the dtype that keeps it."""
    if requantised:
        formats = ", ".join(sorted(set(requantised.values())))
        log.info(f"--dtype int4 re-quantised the GGUF's {formats} tensors ({len(requantised)}) to int4 groups; "
                 "--dtype gguf runs each at the file's precision")


def _drop_weight(model: nn.Module, linear: str) -> None:
    """A layer's linear whose own blocks matched needs its float weight no longer (quantize.quantise_model
    reads the blocks, and no prompt copy is taken): it goes back to the meta device until the layer is done."""
    module = model.get_submodule(linear)
    module._parameters["weight"] = nn.Parameter(torch.empty(module.weight.shape, device="meta"), requires_grad=False)


def _give_back() -> None:
    """Return the memory freed to the system, after each tensor and layer: glibc keeps freed blocks
    below its mapping threshold (which grows to 32 MiB as large tensors come and go) in its heap,
    where they still count as the process's resident memory; a first run on a 1.7B target kept
    ~0.7 GB so. Nothing where the C library has no ``malloc_trim``."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@cache
def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


class Progress:
    """A long preparation's notices: layers done and the time left at the rate since the first layer
    (reading the embeddings first takes longer than a layer), every ``NOTICE_EVERY_S`` seconds at most,
    one line each (stderr may be a log file)."""

    def __init__(self, what: str, clock: Callable[[], float] = time.monotonic):
        self.what, self.clock = what, clock
        self.start = self.last = clock()
        self.first: tuple[float, int] | None = None

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        self.first = self.first or (now, done)
        if done < total and now - self.last < NOTICE_EVERY_S:
            return
        self.last = now
        if done == total:
            log.info(f"{self.what}: {total} of {total} layers in {now - self.start:.0f} s")
            return
        since, first_done = self.first
        left = seconds_left(done - first_done, total - done, now - since)
        log.info(f"{self.what}: {done} of {total} layers" + (f", about {left:.0f} s left" if left is not None else ""))


def seconds_left(done: int, left: int, elapsed: float) -> float | None:
    """The time ``left`` more layers take at the rate of ``done`` in ``elapsed`` seconds; None before any."""
    return elapsed / done * left if done > 0 else None
