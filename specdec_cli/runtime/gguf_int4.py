"""A GGUF's own 4-bit blocks as int4 groups, so that ``--dtype int4`` runs the weights the file holds
instead of re-quantising their float de-quantisation.

Q4_1 stores 32 weights as ``q * d + m`` (q 0..15, d and m in float16), Q4_0 as ``(q - 8) * d``:
exactly the (q, scale, minimum) form quantize.Int4Linear takes. transformers reorders some rows
when it converts a GGUF (llama's q/k projections), so each tensor's rows are matched to the
converted float weight by their exact de-quantised values (gguf_blocks.row_order); a tensor whose
rows do not all match is left to be quantised from float. ``--dtype gguf`` keeps every format's
blocks (gguf_blocks.py); these are int4's, and torch's int4 kernel's when specdec's is unavailable.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from .gguf_blocks import module_name, row_order
from .quantize import GROUP, dequantize_int4

Q4_KINDS = ("Q4_0", "Q4_1")


def decode_q4(raw: np.ndarray, kind: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of Q4_0 / Q4_1 blocks (uint8, one row of blocks per output row) as (q, scale, minimum);
    q as uint8 (0..15), a quarter of int32's memory for a big target's tensor."""
    rows = raw.shape[0]
    header = 4 if kind == "Q4_1" else 2
    blocks = raw.reshape(rows, -1, header + GROUP // 2)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if kind == "Q4_1" else -8 * d
    packed = blocks[..., header:]
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)  # low nibbles hold weights 0..15, high ones 16..31
    return torch.from_numpy(q.reshape(rows, -1)), torch.from_numpy(d), torch.from_numpy(m)


def matched_blocks(raw: np.ndarray, kind: str, weight: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """A 4-bit GGUF tensor's blocks ``raw`` as (q, scale, minimum) in the rows of ``weight``, its
    de-quantised float weight as the conversion ordered it (float32, before any cast); None when
    they do not match."""
    q, scale, minimum = decode_q4(raw, kind)
    if q.shape != weight.shape:
        return None
    order = row_order(lambda rows: dequantize_int4(q[rows], scale[rows], minimum[rows]), q.shape[0], weight)
    return None if order is None else (q[order], scale[order], minimum[order])


def gguf_int4_blocks(path: Path, model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Module name -> (q, scale, minimum) for every 4-bit GGUF tensor that matches the float model
    it was converted into: ``matched_blocks`` over a whole file."""
    import gguf

    found = {}
    for tensor in gguf.GGUFReader(path).tensors:
        kind = tensor.tensor_type.name
        name = module_name(tensor.name)
        if kind not in Q4_KINDS or name is None:
            continue
        try:
            module = model.get_submodule(name)
        except AttributeError:
            continue
        blocks = matched_blocks(np.asarray(tensor.data), kind, module.weight)
        if blocks is not None:
            found[name] = blocks
    return found
