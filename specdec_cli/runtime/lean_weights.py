"""What the lean forward (lean_forward.py) runs on: a quantised linear's kernel as a plain function,
a decoder layer's norms and kernels, and whether a model is one it covers."""

from __future__ import annotations

import torch

from . import native_kernels
from .lean_architectures import LEAN_TYPES, whole_static_rope
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
    """A causal LM of an architecture the lean forward runs (Llama, Mistral, Qwen 2 and 3, Phi-3, Gemma 2,
    Gemma 3's text model) whose linears are all quantised (q/k/v and gate/up fused where they have no biases),
    with a rope that depends on the position alone and nothing the lean layers do not compute."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in LEAN_TYPES or not whole_static_rope(config):
        return False
    if config.model_type in ("gemma3_text", "gemma2"):  # Gemma 3's attention soft-caps nothing: a config that says so is not run
        if (config.hidden_activation != "gelu_pytorch_tanh" or getattr(config, "use_bidirectional_attention", False)
                or config.attention_bias or (config.model_type == "gemma3_text" and config.attn_logit_softcapping is not None)):
            return False
    elif config.hidden_act != "silu" or getattr(config, "mlp_bias", False) or (
            getattr(config, "attention_bias", False) and config.model_type != "qwen2"):
        return False
    if not all(layer_supported(layer) for layer in model.model.layers):
        return False
    head = model.lm_head
    return isinstance(head, QUANTISED_LINEARS) and head.bias is None


def layer_kinds(config) -> tuple[list[str], dict[str, int | None]]:
    """Per decoder layer its kind, and per kind its sliding window (None: it sees every position), as
    decoding/tree.py's tree_masks reads them: ``layer_types`` where the config has them, else every
    layer slides where it sets a window (Mistral), else none does."""
    window = getattr(config, "sliding_window", None)
    kinds = getattr(config, "layer_types", None) or (
        ["sliding_attention" if window else "full_attention"] * config.num_hidden_layers)
    kinds = list(kinds[: config.num_hidden_layers])
    return kinds, {kind: window if kind == "sliding_attention" else None for kind in dict.fromkeys(kinds)}


def layer_weights(layer, intermediate: int) -> tuple:
    """A quantised Llama-like decoder layer's norms and kernels, as ``LeanDecoder.layer`` reads them."""
    attention, mlp = layer.self_attn, layer.mlp
    return (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon, qkv_kernel(attention),
            kernel(attention.o_proj, widen=False), layer.post_attention_layernorm.weight,
            layer.post_attention_layernorm.variance_epsilon, kernel(fused(mlp.gate_up_proj)), kernel(mlp.down_proj, widen=False),
            intermediate)


def qkv_kernel(attention, norm=None, norm_weights=None):
    """h [rows, hidden] -> [rows, (q + 2 kv heads) · dim]: the fused q/k/v kernel, or q, k and v's own
    with their biases added (Qwen 2: biased siblings are not fused); with q/k norms (Qwen 3, Gemma 3)
    each q and k head normed as transformers norms it, by ``norm(x, *norm_weights(module))`` (Llama's
    ``rms_norm`` and ``plain_norm`` where None)."""
    if getattr(attention, "qkv_proj", None) is not None:
        projected = kernel(fused(attention.qkv_proj))
    else:
        q, k, v = (biased(getattr(attention, name)) for name in ("q_proj", "k_proj", "v_proj"))

        def projected(h):
            return torch.cat([q(h), k(h), v(h)], dim=-1)
    q_norm = getattr(attention, "q_norm", None)
    if q_norm is None:
        return projected
    norm, norm_weights = norm or rms_norm, norm_weights or plain_norm
    k_norm, dim = attention.k_norm, attention.head_dim
    heads = attention.q_proj.out_features // dim
    kv_heads = attention.k_proj.out_features // dim
    q_weight, q_eps, k_weight, k_eps = (*norm_weights(q_norm), *norm_weights(k_norm))

    def normed(h):
        out = projected(h).view(h.shape[0], heads + 2 * kv_heads, dim)
        q_out, k_out = norm(out[:, :heads], q_weight, q_eps), norm(out[:, heads : heads + kv_heads], k_weight, k_eps)
        return torch.cat([q_out, k_out, out[:, heads + kv_heads :]], dim=1)
    return normed


def rms_norm(x, weight, eps):
    """Llama's RMSNorm on float32 ``x`` (Qwen 3's q/k norms too): the weight times the normed input."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def plain_norm(module) -> tuple[torch.Tensor, float]:
    """A Llama-style RMSNorm's (weight, eps), as ``rms_norm`` takes them."""
    return module.weight, module.variance_epsilon


def biased(linear):
    """``linear``'s kernel with its bias added, as its forward adds it."""
    run, bias = kernel(linear), linear.bias
    return run if bias is None else (lambda x: run(x) + bias)


def fused(module):
    """The quantised linear of siblings fused by specdec (fused_projections.py), or fused in the checkpoint (Phi-3)."""
    return module.linear if isinstance(module, SharedProjection) else module


def layer_supported(layer) -> bool:
    """A decoder layer whose projections are quantised, q/k/v fused or (with biases) each its own, gate/up fused."""
    attention, mlp = layer.self_attn, layer.mlp
    qkv = getattr(attention, "qkv_proj", None)
    if qkv is not None:
        if not (isinstance(fused(qkv), QUANTISED_LINEARS) and fused(qkv).bias is None):
            return False
    elif not all(isinstance(getattr(attention, name, None), QUANTISED_LINEARS) for name in ("q_proj", "k_proj", "v_proj")):
        return False
    gate_up = fused(getattr(mlp, "gate_up_proj", None))
    if not (isinstance(gate_up, QUANTISED_LINEARS) and gate_up.bias is None):
        return False
    return all(isinstance(m, QUANTISED_LINEARS) and m.bias is None for m in (attention.o_proj, mlp.down_proj))
