"""A prompt's forward on dense (bfloat16 or float32) copies of a quantised target's weights.

Decoding streams every weight once per token, so the weight-only int4/int8 kernels win there: it is
the bytes. A prompt's forward multiplies each weight by many rows, and there the int4 kernel is
compute-bound. A CPU with AMX (or AVX-512 BF16) runs oneDNN's bfloat16 matmul several times faster,
the more so the more rows. Elsewhere bfloat16 is emulated (slower than int4), but float32 BLAS still
beats the int4 kernel from a few dozen rows on, for twice bfloat16's memory. Those were torch's int4
kernels. specdec's own on AVX-512 VNNI multiply int8 codes at 64 a cycle and beat bfloat16 without
AMX at every prompt length measured: there prompts stay on the kernels and no copies are made
(the figures: docs/notebook.md, "A prompt's forward").

So a forward on an empty cache that asks for its last row's logits only — a prompt; a verify block
scores every row — runs its linears on those copies, taken from the float model before
quantisation (for a GGUF target, its own blocks de-quantised), and its attention as one causal
call. Plain and speculative decoding share that forward, so their outputs stay identical; the
prompt's positions differ from the kernels' arithmetic by round-off. ``SPECDEC_DENSE_PREFILL=0``
turns it off, ``=1`` on with the CPU's dtype (also where the kernels would run prompts),
``=bfloat16`` / ``=float32`` picks the dtype.
"""

from __future__ import annotations

import os

import torch

# Prompt rows from which the dense weights pay; below, the kernels' forward is as fast (bfloat16 on
# AMX), or faster: float32 streams 8x an int4 target's bytes, which a short prompt's few rows do
# not repay (docs/notebook.md, "A prompt's forward").
DENSE_FROM = {torch.bfloat16: 8, torch.float32: 20}


def dense_dtype(kernel_path: str = "") -> torch.dtype | None:
    """The dtype of a prompt's weights on this CPU, or None to keep the kernels'. ``kernel_path``:
    the CPU path of specdec's kernels where the target runs on them (native_kernels.cpu_path), else ""."""
    setting = os.environ.get("SPECDEC_DENSE_PREFILL")
    if setting == "0":
        return None
    if setting in ("bfloat16", "float32"):
        return getattr(torch, setting)
    if setting != "1" and kernel_path == "avx512" and not supported("_is_amx_tile_supported"):
        return None
    return torch.bfloat16 if fast_bfloat16() else torch.float32


def fast_bfloat16() -> bool:
    """AMX or AVX-512 BF16: without them oneDNN emulates bfloat16, slower than the int4 kernel."""
    return supported("_is_amx_tile_supported") or supported("_is_avx512_bf16_supported")


def supported(probe: str) -> bool:
    """torch's answer to one of its ``torch.cpu._is_*_supported`` probes; False where it has none."""
    check = getattr(torch.cpu, probe, None)
    try:
        return bool(check is not None and check())
    except (RuntimeError, AttributeError):
        return False


def dense_weights(model, dtype: torch.dtype) -> list[tuple[torch.Tensor, ...]] | None:
    """Per decoder layer of a float Llama model, ``dense_layer_weights``; None for another architecture."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if getattr(model.config, "model_type", None) != "llama" or layers is None:
        return None
    return [dense_layer_weights(layer, dtype) for layer in layers]


def dense_layer_weights(layer, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """A float Llama decoder layer's (q/k/v stacked, o, gate/up stacked, down) in ``dtype``, stacked
    in the order of the fused kernels (fused_projections.py)."""
    attention, mlp = layer.self_attn, layer.mlp
    return tuple(stacked(dtype, *linears) for linears in ((attention.q_proj, attention.k_proj, attention.v_proj),
                                                          (attention.o_proj,), (mlp.gate_proj, mlp.up_proj),
                                                          (mlp.down_proj,)))


def stacked(dtype: torch.dtype, *linears) -> torch.Tensor:
    return torch.cat([linear.weight.detach() for linear in linears]).to(dtype)


def lean_layer(weights: tuple, dense: tuple[torch.Tensor, ...]) -> tuple:
    """A lean layer's weights (lean_weights.layer_weights) with its four matmuls on ``dense`` instead."""
    norm1, eps1, _, _, norm2, eps2, _, _, inner = weights
    qkv, o, gate_up, down = dense
    return (norm1, eps1, dense_kernel(qkv), dense_kernel(o, widen=False), norm2, eps2, dense_kernel(gate_up),
            dense_kernel(down, widen=False), inner)


def dense_kernel(weight: torch.Tensor, widen: bool = True):
    """x (rows, in) float32 -> (rows, out) through a matmul in the weight's dtype, cast as
    lean_weights.kernel casts (for float32 weights the casts are no-ops)."""

    def matmul(x):
        out = torch.nn.functional.linear(x.to(weight.dtype), weight)
        return out.to(x.dtype) if widen else out
    return matmul
