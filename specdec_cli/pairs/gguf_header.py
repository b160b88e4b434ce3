"""A GGUF file's tensor table, read from its header without building its metadata.

Preparing a target needs each tensor's name, format, shape and place in the file, and the file's
architecture. gguf-py's ``GGUFReader`` also builds every metadata value, one numpy view per element
of every array: 15 s for a 262k-token vocabulary, for values the conversion has already turned into
its config and tokenizer. Here the metadata is stepped over (an array of numbers in one step, one of
strings a length at a time) and only the two values read that the table needs. Each tensor is
described as ``GGUFReader`` describes it (gguf-py's own types and block sizes; tested against it).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np

from gguf import (GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, READER_SUPPORTED_VERSIONS, GGMLQuantizationType,
                  GGUFValueType, quant_shape_to_byte_shape)

SCALARS = {GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
           GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
           GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
           GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d"}
# the formats GGUFReader gives as numbers; every other one as its blocks' bytes
NUMBERS = {GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F32: np.float32,
           GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
           GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
           GGMLQuantizationType.I64: np.int64}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor's place in the file, as ``GGUFReader``'s ``ReaderTensor`` gives it."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # of its data as read: numbers, or a block format's bytes per row
    dtype: type
    data_offset: int  # from the start of the file
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    architecture: str
    tensors: list[TensorEntry]


def read_header(path: Path) -> GGUFHeader:
    """The file's architecture and tensor table; ValueError where ``GGUFReader`` would refuse the header
    (a big-endian file too, which transformers' conversion has already refused)."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        magic, version, tensor_count, kv_count = _unpack(data, 0, "<IIQQ")
        if magic != GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file (its magic number is not GGUF's)")
        if version not in READER_SUPPORTED_VERSIONS:
            raise ValueError(f"{path} is GGUF version {version}, which gguf-py does not read")
        values, at = _metadata(data, 24, kv_count)
        entries, at = _table(data, at, tensor_count)
    if "general.architecture" not in values:
        raise ValueError(f"{path} names no general.architecture")
    start = -(-at // values["general.alignment"]) * values["general.alignment"]
    return GGUFHeader(values["general.architecture"], [_entry(*entry, start) for entry in entries])


WANTED = {"general.architecture": GGUFValueType.STRING, "general.alignment": GGUFValueType.UINT32}


def _metadata(data: mmap.mmap, at: int, count: int) -> tuple[dict, int]:
    """The values of ``WANTED`` among ``count`` keys from ``at`` (the alignment defaulted), and where the keys end."""
    values = {"general.alignment": GGUF_DEFAULT_ALIGNMENT}
    for _ in range(count):
        key, at = _string(data, at)
        (kind,) = _unpack(data, at, "<I")
        at += 4
        if key in WANTED:
            if kind != WANTED[key]:
                raise ValueError(f"the GGUF's {key} is not a {WANTED[key].name.lower()}")
            values[key] = _string(data, at)[0] if kind == GGUFValueType.STRING else _unpack(data, at, "<I")[0]
        at = _skipped(data, at, kind)
    alignment = values["general.alignment"]
    if alignment == 0 or alignment & (alignment - 1):
        raise ValueError(f"the GGUF's alignment {alignment} is not a power of two")
    return values, at


def _skipped(data: mmap.mmap, at: int, kind: int) -> int:
    """Where the value of type ``kind`` at ``at`` ends."""
    kind = GGUFValueType(kind)
    if kind in SCALARS:
        return at + struct.calcsize(SCALARS[kind])
    if kind == GGUFValueType.STRING:
        return at + 8 + _unpack(data, at, "<Q")[0]
    item, count = _unpack(data, at, "<IQ")
    at += 12
    item = GGUFValueType(item)
    if item in SCALARS:
        return at + count * struct.calcsize(SCALARS[item])
    for _ in range(count):
        at = _skipped(data, at, item)
    return at


def _table(data: mmap.mmap, at: int, count: int) -> tuple[list[tuple], int]:
    """``count`` tensors' (name, dimensions as the file lists them, type, offset in the data), and where they end."""
    entries = []
    for _ in range(count):
        name, at = _string(data, at)
        (dims,) = _unpack(data, at, "<I")
        shape = _unpack(data, at + 4, f"<{dims}Q")
        at += 4 + 8 * dims
        kind, offset = _unpack(data, at, "<IQ")
        entries.append((name, shape, kind, offset))
        at += 12
    names = [entry[0] for entry in entries]
    if len(set(names)) != len(names):
        raise ValueError(f"the GGUF names a tensor twice: {next(n for n in names if names.count(n) > 1)}")
    return entries, at


def _entry(name: str, dims: tuple[int, ...], kind: int, offset: int, start: int) -> TensorEntry:
    """A tensor as ``GGUFReader`` shapes its data: numbers in numpy's order, or a block format's rows of bytes."""
    kind = GGMLQuantizationType(kind)
    elements = prod(dims)
    block, size = GGML_QUANT_SIZES[kind]
    shape = tuple(reversed(dims))
    if kind not in NUMBERS:
        shape = quant_shape_to_byte_shape(shape, kind)
    return TensorEntry(name, kind, shape, NUMBERS.get(kind, np.uint8), start + offset, elements * size // block)


def _unpack(data: mmap.mmap, at: int, layout: str) -> tuple:
    try:
        return struct.unpack_from(layout, data, at)
    except struct.error:
        raise ValueError("the GGUF's header ends early") from None


def _string(data: mmap.mmap, at: int) -> tuple[str, int]:
    (length,) = _unpack(data, at, "<Q")
    if at + 8 + length > len(data):
        raise ValueError("the GGUF's header ends early")
    return data[at + 8 : at + 8 + length].decode("utf-8"), at + 8 + length
