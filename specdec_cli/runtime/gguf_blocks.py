"""A GGUF tensor's own blocks as specdec's kernel takes them (``--dtype gguf``), so that every tensor
runs at the precision the file holds instead of being re-quantised from its float de-quantisation.

specdec's kernel (quantize.Q8Linear) holds ``w = scale * code + offset`` per block of 32 inputs,
codes 4- or 8-bit unsigned, scale and offset float32 here (native_kernels.pack stores them as float16
where the file's are). Most GGUF formats are exactly that:

    Q4_0  code q (4-bit), scale d, offset −8d          Q4_1  code q, scale d, offset m
    Q5_0  code q (0..31, 8-bit), scale d, offset −16d  Q5_1  code q, scale d, offset m
    Q8_0  code q + 128 (8-bit), scale d, offset −128d
    Q4_K  per 32: code q (4-bit), scale d·sc, offset −dmin·m   Q5_K  the same with 5-bit q as 8-bit codes
    Q6_K  per 16: code q (6-bit, a byte each), scale d·sc, offset −32·d·sc: the kernel's ``bits`` 6,
          a scale and an offset per half block (native/q8_matmul.cpp)

(d, m float16 and sc, m 6- or 8-bit, so every product is exact in float32 and ``scale * code + offset``
is what gguf's own de-quantisation computes, bit for bit: tested.)

transformers reorders some rows when it converts a GGUF (llama's q/k projections), so a tensor's rows
are matched to the converted float weight by their exact de-quantised values (``row_order``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

SUPER = 256  # weights per K-quant super-block
FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")  # those kept as blocks; others run float32
ROLES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


@dataclass
class FileBlocks:
    """One GGUF tensor (``kind``) as the kernel takes it: weights ``scale * codes + offset`` per group of
    32 inputs (16 at ``bits`` 6), codes uint8 [rows, K] (below 2**bits; a byte each at 6), scale and
    offset float32 [rows, K / group]."""

    kind: str
    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    bits: int

    def values(self, rows=slice(None)) -> torch.Tensor:
        """The weights of ``rows``, float32, by the ops native_kernels.unpack does (a multiply, then an add)."""
        codes = self.codes[rows]
        grouped = codes.float().view(codes.shape[0], self.scale.shape[1], -1)
        return (grouped * self.scale[rows][..., None] + self.offset[rows][..., None]).view(codes.shape)

    def rows(self, order) -> "FileBlocks":
        return FileBlocks(self.kind, self.codes[order], self.scale[order], self.offset[order], self.bits)


def module_name(gguf_name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj``; ``output.weight`` -> ``lm_head``."""
    if gguf_name == "output.weight":
        return "lm_head"
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in ROLES:
        return f"model.layers.{parts[1]}.{ROLES[parts[2]]}"
    return None


def decode(raw: np.ndarray, kind: str) -> FileBlocks:
    """Rows of a GGUF tensor's raw blocks (uint8, one row of blocks per output row) as the kernel's blocks."""
    rows = raw.shape[0]
    decoder, size = DECODERS[kind]
    codes, scale, offset, bits = decoder(np.ascontiguousarray(raw).reshape(-1, size))
    def tensor(values: np.ndarray, dtype) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(values.astype(dtype)).reshape(rows, -1))
    return FileBlocks(kind, tensor(codes, np.uint8), tensor(scale, np.float32), tensor(offset, np.float32), bits)


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[:, at : at + 2].copy().view(np.float16)[:, 0].astype(np.float32)


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """[n, 16 * c] -> [n, 32 * c]: per 16 bytes, the low nibbles hold weights 0..15, the high ones 16..31."""
    chunks = packed.reshape(packed.shape[0], -1, 1, 16)
    return (np.concatenate([chunks & 0x0F, chunks >> 4], axis=2)).reshape(packed.shape[0], -1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0 / Q5_1's 32 fifth bits (a little-endian uint32), as 0 or 16 per weight."""
    bits = qh.copy().view(np.uint32)[:, 0:1] >> np.arange(32, dtype=np.uint32)
    return ((bits & 1) << 4).astype(np.uint8)


def _q4_0(b):
    d = _half(b, 0)[:, None]
    return (_nibbles(b[:, 2:]), d, -8 * d, 4)


def _q4_1(b):
    return (_nibbles(b[:, 4:]), _half(b, 0)[:, None], _half(b, 2)[:, None], 4)


def _q5_0(b):
    d = _half(b, 0)[:, None]
    return (_nibbles(b[:, 6:]) | _high_bits(b[:, 2:6]), d, -16 * d, 8)


def _q5_1(b):
    return (_nibbles(b[:, 8:]) | _high_bits(b[:, 4:8]), _half(b, 0)[:, None], _half(b, 2)[:, None], 8)


def _q8_0(b):
    d = _half(b, 0)[:, None]
    return (b[:, 2:].view(np.int8).astype(np.int16) + 128, d, -128 * d, 8)


def _k_scales(b):
    """A Q4_K / Q5_K super-block's 8 sub-block scales d·sc and offsets −dmin·m (gguf's get_scale_min)."""
    packed = b[:, 4:16].reshape(-1, 3, 4)
    d, m, md = packed[:, 0], packed[:, 1], packed[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1).astype(np.float32)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1).astype(np.float32)
    return _half(b, 0)[:, None] * sc, -(_half(b, 2)[:, None] * mn)


def _k_low(qs: np.ndarray) -> np.ndarray:
    """128 bytes -> 256 4-bit values: per 32 bytes, the low nibbles are one sub-block, the high ones the next."""
    chunks = qs.reshape(qs.shape[0], -1, 1, 32)
    return np.concatenate([chunks & 0x0F, chunks >> 4], axis=2).reshape(qs.shape[0], SUPER)


def _q4_k(b):
    scale, offset = _k_scales(b)
    return (_k_low(b[:, 16:144]), scale, offset, 4)


def _q5_k(b):
    scale, offset = _k_scales(b)
    high = (b[:, None, 16:48] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # sub-block j: bit j of byte i
    return (_k_low(b[:, 48:176]) | (high.reshape(-1, SUPER) << 4), scale, offset, 8)


def _q6_k(b):
    n = b.shape[0]
    low = b[:, :128].reshape(n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8)[None, None, :, None]
    high = b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]
    q = (low & 0x0F).reshape(n, SUPER) | ((high & 0x03).reshape(n, SUPER) << 4)
    scale = _half(b, 208)[:, None] * b[:, 192:208].view(np.int8).astype(np.float32)  # [n, 16]: per 16 weights
    return q, scale, -32 * scale, 6


# format -> (decoder: blocks [n, bytes] -> (codes, scale, offset, bits) per block, bytes per block)
DECODERS: dict[str, tuple[Callable, int]] = {
    "Q4_0": (_q4_0, 18), "Q4_1": (_q4_1, 20), "Q5_0": (_q5_0, 22), "Q5_1": (_q5_1, 24), "Q8_0": (_q8_0, 34),
    "Q4_K": (_q4_k, 144), "Q5_K": (_q5_k, 176), "Q6_K": (_q6_k, 210),
}

ROWS_AT_ONCE = 1024  # rows de-quantised at a time to match them: a big target's tensor is never copied whole


def row_order(values: Callable[[torch.Tensor | slice], torch.Tensor], height: int,
              weight: torch.Tensor) -> torch.Tensor | None:
    """The permutation p with ``values(p)`` equal to ``weight`` exactly, or None when there is none.
    Both sides are projected on one random vector in float64, so equal rows sort alike, and the
    match is then checked exactly."""
    if weight.shape[0] != height:
        return None
    probe = torch.randn(weight.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    chunks = range(0, height, ROWS_AT_ONCE)
    theirs = torch.cat([values(slice(i, i + ROWS_AT_ONCE)).double() @ probe for i in chunks])
    mine = torch.cat([weight[i : i + ROWS_AT_ONCE].detach().double() @ probe for i in chunks])
    order = torch.argsort(theirs)[torch.argsort(torch.argsort(mine))]
    exact = all(torch.equal(values(order[i : i + ROWS_AT_ONCE]), weight[i : i + ROWS_AT_ONCE].detach().float())
                for i in chunks)
    return order if exact else None


def matched(raw: np.ndarray, kind: str, weight: torch.Tensor) -> FileBlocks | None:
    """A GGUF tensor's blocks ``raw`` in the rows of ``weight``, its de-quantised float weight as the
    conversion ordered it (float32); None when they do not match."""
    blocks = decode(raw, kind)
    if blocks.codes.shape[1] != weight.shape[1]:
        return None
    order = row_order(blocks.values, blocks.codes.shape[0], weight)
    return None if order is None else blocks.rows(order)


def format_counts(model: torch.nn.Module) -> dict[str, int]:
    """How many of ``model``'s linears run in each format: a GGUF format where its blocks run as the
    file holds them, ``int4`` / ``int8`` where specdec re-quantised them, ``F32`` for a float linear.
    From the record a prepared target keeps (``tensor_formats``, set when prepared and when mapped
    back, prepared_file.py); empty for a target not prepared from a GGUF."""
    return dict(sorted(Counter(getattr(model, "tensor_formats", {}).values()).items()))
