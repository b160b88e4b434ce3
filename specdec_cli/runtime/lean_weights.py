"""What the lean forward (lean_forward.py) runs on: a quantised linear's kernel as a plain function,
a decoder layer's norms and kernels, and whether a model is one it covers."""

from __future__ import annotations

import torch

from . import native_kernels
from .fused_projections import SharedProjection
from .quantize import Int4Linear, Int8Linear, Q8Linear, padded_columns

QUANTISED_LINEARS = (Int4Linear, Int8Linear, Q8Linear)


def kernel(linear, widen: bool = True):
    """x (rows, in) float32 -> (rows, out) float32 through ``linear``'s weight-only kernel: what its
    forward computes, without the reshapes a 2D input does not need. ``widen=False`` leaves the
    output in the kernel's bfloat16, for a caller that adds it to a float32 tensor: type promotion
    widens it exactly inside the add, the same sum for one op less."""
    if isinstance(linear, Q8Linear):  # float32 in and out: nothing to widen
        codes, scale, offset, bits, width = linear.codes, linear.scale, linear.offset, linear.bits, linear.out_features
        padded = codes.shape[0] * native_kernels.TILE != width
        op, avx512 = linear.kernels.q8_matmul, linear.kernels.avx512

        def native(x):
            out = op(x, codes, scale, offset, bits, avx512)
            return out[:, :width] if padded else out
        return native
    if isinstance(linear, Int4Linear):
        packed, group, table, width = linear.packed, linear.group, linear.scales_and_zeros, linear.out_features
        padded = packed.shape[0] * 8 != width  # the int4 pack holds rows in 16s; padding rows are cut

        def int4(x):
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(table.dtype), packed, group, table)
            out = out[:, :width] if padded else out
            return out.to(x.dtype) if widen else out
        return int4
    q, scale, columns = linear.q, linear.scale, linear.q.shape[1]

    def int8(x):
        out = torch.ops.aten._weight_int8pack_mm(padded_columns(x.to(scale.dtype), columns), q, scale)
        return out.to(x.dtype) if widen else out
    return int8


def supported(model) -> bool:
    """A Llama-architecture causal LM whose linears are all fused and quantised, without biases or
    position-dependent rope scaling."""
    config = getattr(model, "config", None)
    if config is None or config.model_type != "llama" or config.hidden_act != "silu":
        return False
    if config.attention_bias or config.mlp_bias:
        return False
    if not all(layer_supported(layer) for layer in model.model.layers):
        return False
    head = model.lm_head
    return isinstance(head, QUANTISED_LINEARS) and head.bias is None


def layer_weights(layer, intermediate: int) -> tuple:
    """A fused, quantised decoder layer's norms and kernels, as ``LeanDecoder.layer`` reads them."""
    attention, mlp = layer.self_attn, layer.mlp
    return (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon, kernel(attention.qkv_proj.linear),
            kernel(attention.o_proj, widen=False), layer.post_attention_layernorm.weight,
            layer.post_attention_layernorm.variance_epsilon, kernel(mlp.gate_up_proj.linear), kernel(mlp.down_proj, widen=False),
            intermediate)


def layer_supported(layer) -> bool:
    """A Llama decoder layer whose projections are fused and quantised, without biases."""
    attention, mlp = layer.self_attn, layer.mlp
    shared = (getattr(attention, "qkv_proj", None), getattr(mlp, "gate_up_proj", None))
    if not all(isinstance(s, SharedProjection) and isinstance(s.linear, QUANTISED_LINEARS) and s.linear.bias is None
               for s in shared):
        return False
    return all(isinstance(m, QUANTISED_LINEARS) and m.bias is None for m in (attention.o_proj, mlp.down_proj))
