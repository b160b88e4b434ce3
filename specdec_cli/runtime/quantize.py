"""Weight-only int8 and int4 linears on torch's own CPU kernels, so that a token streams 1 or 0.5 bytes
per weight instead of 4: decoding a small target on a CPU is bound by weight bandwidth.

int8: one scale per output channel (``aten._weight_int8pack_mm``). int4: per group of ``GROUP``
input weights a scale and a zero, ``w = (q - 8) * scale + zero`` with q in 0..15
(``aten._weight_int4pack_mm_for_cpu``). GGUF Q4_0 / Q4_1 blocks hold 32 weights as ``q * d + m``:
they map onto the same groups exactly (scale = d, zero = m + 8 d), without re-quantising
(gguf_int4.py). The scales, and what the kernels take and give, are bfloat16 (float32 inputs take
their slow paths); the rest of the model stays float32 and each linear casts at its edges. torchao provides the same kernels behind tensor subclasses; calling
the two ops directly keeps the per-layer dispatch small and lets GGUF blocks go in as they are.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from . import native_kernels
from .fused_projections import install, sibling_groups

GROUP = 32  # weights per int4 group: a GGUF block
QUANTISED = ("int8", "int4", "gguf")  # gguf: each GGUF tensor at its own precision (gguf_linears.py)
INNER_K_TILES = 8
ROWS = 16  # output rows the int4 kernel packs together; others are padded with zero rows
# Input columns of an int8 weight: on AVX-512 the kernel reads each weight row, and each input row,
# with aligned 16-byte loads, so a row of other widths faults (even on the heap); zero columns pad it.
COLUMNS = 16
ROWS_AT_ONCE = 4096  # rows of a float weight quantised at a time (a multiple of the kernel's 16-row tiles)


def int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: (q, scale) with weight ≈ q * scale[:, None], scale a float16 value where it can be."""
    weight = weight.float()
    scale = float16_rounded(weight.abs().amax(dim=1) / 127).clamp(min=SMALLEST_SCALE)
    q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def int4_groups(weight: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric group-wise int4 from float weights: (q 0..15, scale, minimum), per row and group,
    with weight ≈ q * scale + minimum (the GGUF Q4_1 form: min and max of each group, as float16
    values where they can be, so that specdec's kernel keeps them in two bytes as Q4_1 does)."""
    rows, columns = weight.shape
    groups = weight.float().reshape(rows, columns // group, group)
    high = groups.amax(dim=2)
    low = float16_rounded(groups.amin(dim=2))
    scale = float16_rounded((high - low) / 15).clamp(min=SMALLEST_SCALE)
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
    return q.reshape(rows, columns), scale, low


SMALLEST_SCALE = 2.0**-24  # float16's smallest: a constant group's scale, which no code multiplies into a weight


def float16_rounded(values: torch.Tensor) -> torch.Tensor:
    """``values`` rounded to float16 (kept float32) where every one stays finite, else as they are."""
    half = values.half()
    return half.float() if torch.isfinite(half).all() else values


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """q * scale + minimum, group-wise: what the blocks stand for."""
    return (q.float().reshape(q.shape[0], -1, group) * scale[..., None] + minimum[..., None]).reshape(q.shape)


class Int8Linear(nn.Module):
    """``q`` holds ``int8_columns(in_features)`` columns, zeros past ``in_features``; an input is
    padded to match (zero times zero adds nothing to a row's sum, so the result is the same)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__()
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.register_buffer("q", padded_columns(q, int8_columns(q.shape[1])).contiguous())
        self.register_buffer("scale", scale.to(dtype).contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach())

    @classmethod
    def from_saved(cls, q: torch.Tensor, scale: torch.Tensor, in_features: int, bias: torch.Tensor | None = None) -> "Int8Linear":
        """The module whose (already padded) tensors these are (as saved by prepared_file.py), copying nothing."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, q.shape[0]
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = padded_columns(x.reshape(-1, self.in_features).to(self.scale.dtype), self.q.shape[1]).contiguous()
        out = torch.ops.aten._weight_int8pack_mm(flat, self.q, self.scale).to(x.dtype)
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    def dequantized(self) -> torch.Tensor:
        return self.q[:, : self.in_features].float() * self.scale.float()[:, None]


def int8_columns(in_features: int) -> int:
    """The columns an int8 weight of ``in_features`` is stored with."""
    return in_features + -in_features % COLUMNS


def padded_columns(tensor: torch.Tensor, columns: int) -> torch.Tensor:
    """[rows, n] -> [rows, columns], zero columns after the n: an int8 weight and its inputs (mostly as they are)."""
    return tensor if tensor.shape[1] == columns else nn.functional.pad(tensor, (0, columns - tensor.shape[1]))


class Int4Linear(nn.Module):
    def __init__(self, q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, bias: torch.Tensor | None,
                 dtype: torch.dtype, group: int = GROUP):
        super().__init__()
        self.in_features, self.out_features, self.group = q.shape[1], q.shape[0], group
        q, scale, minimum = (_pad_rows(t, ROWS) for t in (q, scale, minimum))  # the kernel packs 16 rows at a time
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), INNER_K_TILES)
        self.register_buffer("packed", packed)
        # The kernel's zero is the value at q = 8: minimum + 8 * scale. Computed in float32, then rounded once to dtype.
        zero = minimum.float() + 8 * scale.float()
        self.register_buffer("scales_and_zeros", torch.stack([scale.float().t(), zero.t()], dim=-1).to(dtype).contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach())

    @classmethod
    def from_packed(cls, packed: torch.Tensor, scales_and_zeros: torch.Tensor, in_features: int, out_features: int,
                    bias: torch.Tensor | None = None, group: int = GROUP) -> "Int4Linear":
        """The module whose kernel tensors these are (as saved by prepared_file.py), without packing anything."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.in_features, self.out_features, self.group = in_features, out_features, group
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("bias", bias)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(self.scales_and_zeros.dtype).contiguous()
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, self.group, self.scales_and_zeros)
        out = out[:, : self.out_features].to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    def dequantized(self) -> torch.Tensor:
        """The weights the kernel multiplies by, in float32 (an identity matrix through the kernel)."""
        eye = torch.eye(self.in_features, dtype=self.scales_and_zeros.dtype)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, self.group, self.scales_and_zeros)
        return out[:, : self.out_features].float().t()


class Q8Linear(nn.Module):
    """int4 or int8 weight codes against int8 activation codes on specdec's own kernel (native_kernels.py):
    ``w = scale * code + offset`` per block of 32 inputs (per 16 at ``bits`` 6: a GGUF Q6_K tensor's,
    gguf_blocks.py). Takes and gives float32."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bits: int, in_features: int,
                 out_features: int, bias: torch.Tensor | None = None):
        """The kernel's own tensors (``native_kernels.pack``'s, or as prepared_file.py saved them), copying nothing;
        the kernel's op is bound here, as the model is built (native_kernels.bound)."""
        super().__init__()
        self.in_features, self.out_features, self.bits = in_features, out_features, bits
        self.kernels = native_kernels.bound()
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)
        self.register_buffer("offset", offset)
        self.register_buffer("bias", None if bias is None else bias.detach())

    @classmethod
    def from_int4(cls, q: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, bias=None) -> "Q8Linear":
        """GGUF Q4_1-style groups (``q * scale + minimum``, q in 0..15), exactly."""
        return cls(*native_kernels.pack(q, scale, minimum, 4), 4, q.shape[1], q.shape[0], bias)

    @classmethod
    def from_int8(cls, q: torch.Tensor, scale: torch.Tensor, bias=None) -> "Q8Linear":
        """Per-channel symmetric int8 (``q * scale``) as codes q + 128 with offset −128 · scale."""
        return cls(*int8_packed(q, scale), 8, q.shape[1], q.shape[0], bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.kernels.matmul(x.reshape(-1, self.in_features).float(), self.codes, self.scale, self.offset, self.bits)
        out = out[:, : self.out_features].to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    def dequantized(self) -> torch.Tensor:
        """The weights the codes stand for, float32 [out, in]."""
        return native_kernels.unpack(self.codes, self.scale, self.offset, self.bits)[: self.out_features]


def native_linear(weight: torch.Tensor, kind: str, bias: torch.Tensor | None = None, blocks=None) -> Q8Linear:
    """A float (out, in) weight, or a GGUF's int4 ``blocks``, on specdec's kernel (int8 where int4 groups do not fit).
    A float weight is quantised ``ROWS_AT_ONCE`` rows at a time: both quantisations and the kernel's
    layout are per row (16-row tiles), so the pieces are the whole weight's, without its several
    float-sized temporaries (a big vocabulary's output layer would otherwise take gigabytes)."""
    if kind == "int4" and blocks is not None:
        return Q8Linear.from_int4(*blocks, bias)
    four = kind == "int4" and fits_int4(weight.shape[1])
    pieces = [native_kernels.pack(*int4_groups(part), 4) if four else int8_packed(*int8_per_channel(part))
              for part in weight.split(ROWS_AT_ONCE)]
    codes = torch.cat([piece[0] for piece in pieces])
    joined = (torch.cat(parts) for parts in zip(*(native_kernels.widened(*piece[1:]) for piece in pieces)))
    scale, offset = native_kernels.compact(*joined)
    return Q8Linear(codes, scale, offset, 4 if four else 8, weight.shape[1], weight.shape[0], bias)


def int8_packed(q: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per-channel symmetric int8 (``q * scale``) in the kernel's layout: codes q + 128, offset −128 · scale."""
    blocks = q.shape[1] // native_kernels.BLOCK
    scale = scale.float()[:, None].expand(-1, blocks)
    return native_kernels.pack(q.to(torch.int32) + 128, scale, -128 * scale, 8)


@contextmanager
def dense_kernels(model: nn.Module):
    """Run ``model``'s weight-only int8/int4 linears as float32 matmuls on their own de-quantised
    weights, rounding inputs and outputs to the kernels' dtype as the kernels do.

    For a training teacher pass (training/distill.py), which scores whole answers, hundreds of rows
    a forward, where the int4 kernel is compute-bound and float32 BLAS is faster. It is the
    kernels' arithmetic up to summation order: its top-1 ids agreed with the kernels' at nearly
    every answer position, and matched the target's greedy answers exactly as often
    (docs/notebook.md, "Figures that were in the code's docstrings"). Costs the float32 weights'
    memory while it lasts, and seconds to de-quantise this project's target: nested, the inner
    context reuses the outer one's weights."""
    patched = [m for m in model.modules() if isinstance(m, (Int4Linear, Int8Linear, Q8Linear)) and "forward" not in vars(m)]
    for module in patched:
        module.forward = _dense_forward(module)
    try:
        yield model
    finally:
        for module in patched:
            del module.forward  # back to the class's kernel forward


def _dense_forward(linear: Int4Linear | Int8Linear | Q8Linear):
    weight = linear.dequantized().contiguous()
    rounding = torch.float32 if isinstance(linear, Q8Linear) else (
        linear.scales_and_zeros if isinstance(linear, Int4Linear) else linear.scale).dtype

    def forward(x: torch.Tensor) -> torch.Tensor:
        out = nn.functional.linear(x.to(rounding).to(x.dtype), weight).to(rounding).to(x.dtype)
        return out if linear.bias is None else out + linear.bias
    return forward


def _pad_rows(tensor: torch.Tensor, multiple: int) -> torch.Tensor:
    missing = -tensor.shape[0] % multiple
    return torch.cat([tensor, tensor.new_zeros(missing, *tensor.shape[1:])]) if missing else tensor


def quantised_linear(linear: nn.Linear, kind: str, dtype: torch.dtype, blocks=None, native: bool = False) -> nn.Module:
    """``linear`` as a weight-only int8 or int4 module; ``blocks`` (q, scale, minimum) from a GGUF
    go in as they are, else the float weight is quantised. ``native``: on specdec's kernel where its
    blocks of 32 inputs fit."""
    if native and native_kernels.fits(linear.in_features):
        return native_linear(linear.weight.detach(), kind, linear.bias, blocks)
    if blocks is not None and kind == "int4":
        return Int4Linear(*blocks, linear.bias, dtype)
    return quantised_weight(linear.weight.detach(), kind, dtype, linear.bias)


def quantised_weight(weight: torch.Tensor, kind: str, dtype: torch.dtype = torch.bfloat16,
                     bias: torch.Tensor | None = None) -> nn.Module:
    """A float (out, in) weight as a weight-only int8 or int4 linear (int8 where int4 groups do not fit)."""
    if kind == "int4" and fits_int4(weight.shape[1]):
        return Int4Linear(*int4_groups(weight), bias, dtype)
    return Int8Linear(*int8_per_channel(weight), bias, dtype)


def fits_int4(in_features: int) -> bool:
    return in_features % GROUP == 0


def quantise_model(model: nn.Module, kind: str, blocks: dict[str, tuple] | None = None,
                   dtype: torch.dtype = torch.bfloat16, fuse: bool = True, native: bool = False) -> nn.Module:
    """Replace every nn.Linear by its weight-only quantised form, in place; ``blocks``: module name →
    GGUF int4 blocks. The lm_head keeps its float weight as ``float_weight`` (for a tied model that is
    the embedding itself), which a draft head scores with and fingerprints its target by. ``dtype``:
    what the kernels take and give (bfloat16: float32 takes their slow paths); the rest of the model
    keeps its own dtype, inputs and outputs are cast at each linear. A linear whose input width is not
    a multiple of 32 cannot take int4 groups and goes to int8. ``fuse``: q/k/v and gate/up become
    one matmul each (fused_projections.py). ``native``: every linear whose input width fits goes to
    specdec's own kernel (Q8Linear, float32 in and out; the caller checked that it loads). Also for a
    bare module (a draft head): no lm_head then."""
    blocks = blocks or {}
    for parent_name, siblings in sibling_groups(model) if fuse else []:
        parent = model.get_submodule(parent_name) if parent_name else model
        linears = [getattr(parent, s) for s in siblings]
        on_native = native and native_kernels.fits(linears[0].in_features)
        if kind == "int4" and fits_int4(linears[0].in_features):
            parts = [blocks.get(f"{parent_name}.{s}" if parent_name else s) or int4_groups(linear.weight.detach())
                     for s, linear in zip(siblings, linears)]
            stacked = [torch.cat(part) for part in zip(*parts)]
            fused = Q8Linear.from_int4(*stacked) if on_native else Int4Linear(*stacked, None, dtype)
        else:  # int8 scales are per row: the stacked weight's are each sibling's own
            stacked = int8_per_channel(torch.cat([linear.weight.detach() for linear in linears]))
            fused = Q8Linear.from_int8(*stacked) if on_native else Int8Linear(*stacked, None, dtype)
        install(parent, siblings, fused, [linear.out_features for linear in linears])
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    named = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    for name, module in named:
        replacement = quantised_linear(module, kind, dtype, blocks.get(name), native)
        if module is output:
            replacement.float_weight = module.weight
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, replacement)
    return model


def output_weight(model) -> torch.Tensor:
    """The lm_head weight in float, also when the lm_head itself is quantised (and, tied to an embedding
    that keeps its GGUF's blocks, block_embedding.py, the embedding's table de-quantised)."""
    head = model.get_output_embeddings()
    if hasattr(head, "float_weight"):
        return head.float_weight
    if not hasattr(head, "weight") and getattr(model.config, "tie_word_embeddings", False):
        return model.get_input_embeddings().weight
    return head.weight
