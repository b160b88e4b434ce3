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
    """Rows of Q4_0 / Q4_1 blocks (uint8, one row of blocks per output row) as (q, scale, minimum)."""
    rows = raw.shape[0]
    header = 4 if kind == "Q4_1" else 2
    blocks = raw.reshape(rows, -1, header + GROUP // 2)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if kind == "Q4_1" else -8 * d
    packed = blocks[..., header:]
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)  # low nibbles hold weights 0..15, high ones 16..31
    return torch.from_numpy(q.reshape(rows, -1).astype(np.int32)), torch.from_numpy(d), torch.from_numpy(m)


def row_order(blocks_values: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """The permutation p with blocks_values[p] == weight exactly, or None when there is none."""
    if blocks_values.shape != weight.shape:
        return None
    probe = torch.randn(weight.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    theirs, mine = blocks_values.double() @ probe, weight.detach().double() @ probe
    order = torch.argsort(theirs)[torch.argsort(torch.argsort(mine))]
    return order if torch.equal(blocks_values[order], weight.detach().float()) else None


def gguf_int4_blocks(path: Path, model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Module name -> (q, scale, minimum) for every 4-bit GGUF tensor that matches the float model
    it was converted into (float32 weights, before any cast)."""
    import gguf

    found = {}
    for tensor in gguf.GGUFReader(path).tensors:
        kind = tensor.tensor_type.name
        name = module_name(tensor.name)
        if kind not in ("Q4_0", "Q4_1") or name is None:
            continue
        try:
            module = model.get_submodule(name)
        except AttributeError:
            continue
        q, scale, minimum = decode_q4(np.asarray(tensor.data), kind)
        order = row_order(dequantize_int4(q, scale, minimum), module.weight)
        if order is not None:
            found[name] = (q[order], scale[order], minimum[order])
    return found
