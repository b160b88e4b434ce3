"""A quantised target prepared one decoder layer at a time, so that a first run needs the prepared
target's memory and one layer's float weights, never the whole float model.

The model's skeleton is built with its parameters on the meta device (its buffers, the rotary
frequencies, are computed as usual). Its weights arrive one tensor at a time (a GGUF's, de-quantised
by gguf_tensors.py); as soon as a decoder layer has all of them, the layer is prepared exactly as the
whole model used to be (its dense prompt copies taken, its linears quantised and fused by
quantize.quantise_model, a GGUF's own 4-bit blocks matched to its rows by gguf_int4.py) and its float
weights are let go. What is outside the layers (embeddings, final norm, output layer) is prepared
last, by the same call. Every step is per layer or per tensor, so the result is the whole model's,
bit for bit (tested against the old whole-model build).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Iterable
from functools import cache

import torch
from torch import nn

from ..notices import log
from ..runtime import dense_prefill
from ..runtime.gguf_int4 import matched_blocks, module_name
from ..runtime.quantize import quantise_model

NOTICE_EVERY_S = 10.0


def prepared_by_layer(model: nn.Module, tensors: Iterable, kind: str, dense_dtype, native: bool,
                      progress: Callable[[int, int], None] | None = None) -> tuple[nn.Module, list | None]:
    """``model`` (parameters on the meta device, or already loaded) quantised to ``kind`` in place
    from ``tensors`` (objects with ``name``, ``value``, and ``gguf_name``/``kind``/``raw`` for a
    GGUF's blocks), and its dense prompt copies per layer (None where there are none). ``progress``
    is told (layers done, layers) as each is finished. ValueError when a weight never arrives."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    layers = list(layers) if isinstance(layers, nn.ModuleList) else []
    dense = [] if dense_dtype is not None and getattr(model.config, "model_type", None) == "llama" and layers else None
    awaited = [{f"{PREFIX}{i}.{name}" for name, tensor in _held(layer) if tensor.is_meta}
               for i, layer in enumerate(layers)]
    blocks: dict[str, tuple] = {}
    done = 0

    def finish_ready() -> None:
        nonlocal done
        while done < len(layers) and not awaited[done]:
            layer, inner = layers[done], f"{PREFIX}{done}."
            if dense is not None:
                dense.append(dense_prefill.dense_layer_weights(layer, dense_dtype))
            own = {name[len(inner):]: blocks.pop(name) for name in [n for n in blocks if n.startswith(inner)]}
            quantise_model(layer, kind, own, native=native)
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
        matched = kind == "int4" and tensor.raw is not None and _match(model, tensor, blocks)
        if matched and dense is None and layer is not None:
            _drop_weight(model, module_name(tensor.gguf_name))  # its blocks are what the kernel takes
        del tensor
        _give_back()
        finish_ready()
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    missing = sorted(set().union(*awaited[done:])) + [name for name, tensor in _held(model) if tensor.is_meta
                                                      and _layer_of(name, len(layers)) is None]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ValueError(f"the weights lack {missing[0]}{more}")
    quantise_model(model, kind, blocks, native=native)  # what is left: the output layer
    _give_back()
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


def _match(model: nn.Module, tensor, blocks: dict) -> bool:
    """A GGUF Q4 tensor's own blocks, kept for its linear where they match its float weight exactly."""
    linear = module_name(tensor.gguf_name)
    if linear is None or f"{linear}.weight" != tensor.name:
        return False
    found = matched_blocks(tensor.raw, tensor.kind, model.get_submodule(linear).weight)
    if found is not None:
        blocks[linear] = found
    return found is not None


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
