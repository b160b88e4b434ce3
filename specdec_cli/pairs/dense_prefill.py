"""A prompt's forward on bfloat16 copies of a quantised target's weights.

Decoding streams every weight once per token, so the weight-only int4/int8 kernels win there: it is
the bytes. A prompt's forward multiplies each weight by many rows, and there the int4 kernel is
compute-bound while a CPU with AMX (or AVX-512 BF16) runs oneDNN's bfloat16 matmul several times
faster: on this project's CPU, gate/up at 37 rows took 1.0 ms in int4 and 0.3 ms in bfloat16, at 512
rows 12.9 ms against 1.1 ms. A whole prompt's forward then streams the 220 MB of bfloat16 weights
instead, and is bound by that.

So a forward on an empty cache that asks for its last row's logits only — a prompt; a verify block
scores every row — runs its linears on bfloat16 copies of the weights, taken from the float model
before quantisation (for a GGUF target, its own blocks de-quantised), and its attention as one causal
call. Plain and speculative decoding share that forward, so their outputs stay identical; the
prompt's positions differ from the kernels' arithmetic by round-off. Where bfloat16 matmuls are not
fast, nothing changes. ``SPECDEC_DENSE_PREFILL=0`` turns it off, ``=1`` on (tests).
"""

from __future__ import annotations

import os

import torch

DENSE_FROM = 8  # prompt rows; below this the kernels' own forward is as fast


def wanted() -> bool:
    setting = os.environ.get("SPECDEC_DENSE_PREFILL")
    if setting in ("0", "1"):
        return setting == "1"
    return fast_bfloat16()


def fast_bfloat16() -> bool:
    """AMX or AVX-512 BF16: without them oneDNN emulates bfloat16, slower than the int4 kernel."""
    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        check = getattr(torch.cpu, probe, None)
        try:
            if check is not None and check():
                return True
        except (RuntimeError, AttributeError):
            continue
    return False


def dense_weights(model) -> list[tuple[torch.Tensor, ...]] | None:
    """Per decoder layer of a float Llama model, ``layer_weights``; None for another architecture."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if getattr(model.config, "model_type", None) != "llama" or layers is None:
        return None
    return [layer_weights(layer) for layer in layers]


def layer_weights(layer) -> tuple[torch.Tensor, ...]:
    """A float Llama decoder layer's (q/k/v stacked, o, gate/up stacked, down) in bfloat16, stacked in
    the order of the fused kernels (fused_projections.py)."""
    attention, mlp = layer.self_attn, layer.mlp
    return (bfloat16(attention.q_proj, attention.k_proj, attention.v_proj), bfloat16(attention.o_proj),
            bfloat16(mlp.gate_proj, mlp.up_proj), bfloat16(mlp.down_proj))


def bfloat16(*linears) -> torch.Tensor:
    return torch.cat([linear.weight.detach() for linear in linears]).to(torch.bfloat16)


def lean_layer(weights: tuple, dense: tuple[torch.Tensor, ...]) -> tuple:
    """A lean layer's weights (lean_forward.layer_weights) with its four matmuls on ``dense`` instead."""
    norm1, eps1, _, _, norm2, eps2, _, _, inner = weights
    qkv, o, gate_up, down = dense
    return (norm1, eps1, dense_kernel(qkv), dense_kernel(o, widen=False), norm2, eps2, dense_kernel(gate_up),
            dense_kernel(down, widen=False), inner)


def dense_kernel(weight: torch.Tensor, widen: bool = True):
    """x (rows, in) float32 -> (rows, out) through a bfloat16 matmul, cast as lean_forward.kernel casts."""

    def matmul(x):
        out = torch.nn.functional.linear(x.to(weight.dtype), weight)
        return out.to(x.dtype) if widen else out
    return matmul
