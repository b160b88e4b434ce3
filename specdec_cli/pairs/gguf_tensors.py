"""A GGUF file's tensors one at a time, de-quantised as transformers' own conversion de-quantises
them, so that a target is prepared from the file without its whole float model in memory.

transformers' ``load_gguf_checkpoint`` reads every tensor into one dictionary of float32 tensors
(four times a Q4 file's size) before the model even exists. The steps per tensor are its own
(``gguf.dequantize``, the architecture's tensor processor, its name map); only the order differs:
each tensor is read, de-quantised and handed on before the next is read. Where each tensor lies comes
from the file's header alone (gguf_header.py). The bytes are read with ``pread``, not through a memory
map: every page of a mapping that was touched counts in the process's resident memory until the
mapping goes, which would be the whole file by the end.
A tensor is de-quantised a few rows at a time: its blocks are independent, so the pieces
are the whole's, without numpy's temporaries for all of it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..runtime.gguf_blocks import FORMATS

WEIGHTS_AT_ONCE = 1 << 20  # de-quantised at a time: numpy's temporaries are several times their float32


@dataclass
class GGUFTensor:
    """One tensor as the model takes it: its transformers name, its float32 value, and where it came
    from (its GGUF name, its quantisation and its raw blocks, for a quantised tensor's own blocks)."""

    name: str
    value: torch.Tensor
    gguf_name: str
    kind: str
    raw: np.ndarray | None


def gguf_tensors(path: Path, model: torch.nn.Module) -> Iterator[GGUFTensor]:
    """The GGUF's tensors, in the file's order, named as ``model`` (a skeleton built from the GGUF's
    conversion: only its config and parameter names are read) names them; a tensor the model has no place
    for is skipped, as transformers skips it. The file's metadata is not parsed again (gguf_header.py):
    the architecture's tensor processor takes the conversion's config, which holds every value the
    processors read (attention heads, key/value heads, experts)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    from .gguf_header import read_header

    header = read_header(path)
    processor = TENSOR_PROCESSORS.get(header.architecture, TensorProcessor)(config=model.config.to_dict())
    names = get_gguf_hf_weights_map(model, processor)
    parsed = {"tensors": {}}  # where some processors (mixtures of experts) put what they assemble
    with open(path, "rb") as handle:
        for tensor in header.tensors:
            raw = _read(handle.fileno(), tensor)
            result = processor.process(weights=_dequantised(raw, tensor.tensor_type), name=tensor.name,
                                       tensor_key_mapping=names, parsed_parameters=parsed)
            if result.name in names:
                value = torch.from_numpy(np.ascontiguousarray(result.weights))
                kind = tensor.tensor_type.name
                blocks = raw if kind in FORMATS else None
                yield GGUFTensor(names[result.name], value, tensor.name, kind, blocks)
                del value, blocks  # held by the model from here, or let go there
            del raw, result
    for name, value in parsed["tensors"].items():
        yield GGUFTensor(name, value, name, "F32", None)


def _read(descriptor: int, tensor) -> np.ndarray:
    """The tensor's bytes, read (not mapped) into memory of this process's own, shaped as gguf-py's reader
    shapes them."""
    buffer = bytearray(tensor.n_bytes)
    view, offset = memoryview(buffer), tensor.data_offset
    while view:
        done = os.preadv(descriptor, [view], offset)
        if done == 0:
            raise ValueError(f"{tensor.name}: the file ends before its data does")
        view, offset = view[done:], offset + done
    return np.frombuffer(buffer, dtype=tensor.dtype).reshape(tensor.shape)


def _dequantised(raw: np.ndarray, kind) -> np.ndarray:
    """``gguf.dequantize``, about ``WEIGHTS_AT_ONCE`` weights at a time (the same values: every block stands alone)."""
    from gguf import dequantize

    rows = max(1, WEIGHTS_AT_ONCE // max(1, raw[0].size * 2)) if raw.ndim >= 2 else raw.shape[0]
    if raw.ndim < 2 or raw.shape[0] <= rows:
        return dequantize(raw, kind)
    first = dequantize(raw[:rows], kind)
    out = np.empty((raw.shape[0], *first.shape[1:]), dtype=first.dtype)
    out[:rows] = first
    for start in range(rows, raw.shape[0], rows):
        out[start : start + rows] = dequantize(raw[start : start + rows], kind)
    return out
