"""A digest of a cache entry's bytes cheap enough to check at every start: sha256 over the entry's
index and a sample of its data, not over all of it.

Hashing the whole prepared target would take longer than the rest of a warm start.
So the data (a file's bytes, or a prepared target's tensors laid end to end) is hashed ``SAMPLE``
bytes at every ``STRIDE``, and at its end. Any damaged run of at least ``STRIDE`` bytes holds a
sampled byte: it spans a multiple of ``STRIDE``, or it holds the last byte. Shorter damage is caught
only where it meets a sample; it is not what a full disk, a copy cut short or a stray write over a
cache file makes. The stride sets that guarantee; the sample's size only the chance of catching less,
so it is small: 1 KiB a mebibyte, a small part of a warm start (docs/notebook.md, "Figures that
were in the code's docstrings").
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

SAMPLE = 1024  # bytes hashed at each sampled offset
STRIDE = 1 << 20  # bytes between sampled offsets: the shortest damaged run always caught


def starts(size: int) -> list[int]:
    """The sampled offsets into ``size`` bytes: every STRIDE, and the last SAMPLE."""
    return sorted({*range(0, size, STRIDE), max(0, size - SAMPLE)}) if size else []


def tensor_digest(tensors: dict[str, torch.Tensor], index: str) -> str:
    """The digest of ``tensors``: ``index`` (the caller's layout), every tensor's name, dtype and
    shape, and ``starts``' samples of their bytes laid end to end in the dict's order, which is the
    order torch.save writes them in (so a damaged run of the file is a run of this stream too)."""
    digest = hashlib.sha256(index.encode())
    digest.update(repr([(name, str(t.dtype), *t.shape) for name, t in tensors.items()]).encode())
    sizes = [t.nbytes for t in tensors.values()]
    offset, total = 0, sum(sizes)
    wanted = iter(starts(total))
    start = next(wanted, total)
    for tensor, size in zip(tensors.values(), sizes):
        if start < offset + size:
            data = tensor.detach().reshape(-1).view(torch.uint8).numpy()
            while start < offset + size:
                digest.update(data[start - offset:start - offset + SAMPLE])
                start = next(wanted, total)
        offset += size
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    """The digest of a file: its size and its sampled bytes."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        digest = hashlib.sha256(str(size).encode())
        for start in starts(size):
            digest.update(os.pread(handle.fileno(), SAMPLE, start))
    return digest.hexdigest()
