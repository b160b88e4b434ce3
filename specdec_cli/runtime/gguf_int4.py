"""A GGUF's own 4-bit blocks as int4 groups, so that ``--dtype int4`` runs the weights the file holds
instead of re-quantising their float de-quantisation.

Q4_1 stores 32 weights as ``q * d + m`` (q 0..15, d and m in float16), Q4_0 as ``(q - 8) * d``:
exactly the (q, scale, minimum) form quantize.Int4Linear takes. transformers reorders some rows
when it converts a GGUF (llama's q/k projections), so each tensor's rows are matched to the
converted float weight by their exact de-quantised values; a tensor whose rows do not all match
is left to be quantised from float.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from .quantize import GROUP, dequantize_int4

# llama.cpp tensor names -> transformers module names (llama family, SmolLM2 included)
Q4_KINDS = ("Q4_0", "Q4_1")
ROLES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def module_name(gguf_name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj``; ``output.weight`` -> ``lm_head``."""
    if gguf_name == "output.weight":
        return "lm_head"
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in ROLES:
        return f"model.layers.{parts[1]}.{ROLES[parts[2]]}"
    return None


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


ROWS_AT_ONCE = 1024  # rows de-quantised at a time to match them: a big target's tensor is never copied whole


def row_order(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """The permutation p with the blocks' rows p equal to ``weight`` exactly (what q[p], scale[p],
    minimum[p] stand for is ``weight``), or None when there is none. Both sides are projected on one
    random vector in float64, so equal rows sort alike, and the match is then checked exactly."""
    if q.shape != weight.shape:
        return None
    probe = torch.randn(weight.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    chunks = range(0, q.shape[0], ROWS_AT_ONCE)
    values = lambda rows: dequantize_int4(q[rows], scale[rows], minimum[rows])  # noqa: E731
    theirs = torch.cat([values(slice(i, i + ROWS_AT_ONCE)).double() @ probe for i in chunks])
    mine = torch.cat([weight[i : i + ROWS_AT_ONCE].detach().double() @ probe for i in chunks])
    order = torch.argsort(theirs)[torch.argsort(torch.argsort(mine))]
    exact = all(torch.equal(values(order[i : i + ROWS_AT_ONCE]), weight[i : i + ROWS_AT_ONCE].detach().float())
                for i in chunks)
    return order if exact else None


def matched_blocks(raw: np.ndarray, kind: str, weight: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """A 4-bit GGUF tensor's blocks ``raw`` as (q, scale, minimum) in the rows of ``weight``, its
    de-quantised float weight as the conversion ordered it (float32, before any cast); None when
    they do not match."""
    q, scale, minimum = decode_q4(raw, kind)
    order = row_order(q, scale, minimum, weight)
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
