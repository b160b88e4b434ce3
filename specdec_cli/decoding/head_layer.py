"""The draft head's decoder layer for drafting with a quantised head: its parameters without
transformers' Llama classes, whose import (the model registry, ``modeling_utils``) costs more
than loading the head, and, imported mid-decode, stalls the round that imports it (docs/notebook.md,
"Figures that were in the code's docstrings"). A quantised head runs every block through the lean
forward's layer (runtime/lean_forward.py, head.py ``lean_forward``), which only reads the layer's
kernels and norms. Training and float heads keep transformers' layer
from the start (head.py)."""

from __future__ import annotations

import torch
from torch import nn

from ..runtime.lean_model import LeanConfig, Norm, Rotary, uninitialised_linear as linear


def layer_config(layer: dict) -> LeanConfig:
    """The head's LlamaConfig fields as attributes (for its cache and the lean forward's shapes),
    without importing transformers."""
    return LeanConfig(**(dict(layer) | {"model_type": "llama"}))


def layer_skeleton(config) -> nn.Module:
    """LlamaDecoderLayer's parameters, on the meta device until the head's weights are assigned."""
    hidden, inner = config.hidden_size, config.intermediate_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or hidden // heads
    bias = getattr(config, "attention_bias", False)
    mlp_bias = getattr(config, "mlp_bias", False)

    attention, mlp, layer = nn.Module(), nn.Module(), nn.Module()
    attention.q_proj = linear(hidden, heads * dim, bias)
    attention.k_proj = linear(hidden, kv_heads * dim, bias)
    attention.v_proj = linear(hidden, kv_heads * dim, bias)
    attention.o_proj = linear(heads * dim, hidden, bias)
    mlp.gate_proj = linear(hidden, inner, mlp_bias)
    mlp.up_proj = linear(hidden, inner, mlp_bias)
    mlp.down_proj = linear(inner, hidden, mlp_bias)
    layer.self_attn, layer.mlp = attention, mlp
    for name in ("input_layernorm", "post_attention_layernorm"):
        norm = Norm(config.rms_norm_eps)
        norm.weight = nn.Parameter(torch.empty(hidden, device="meta"))
        setattr(layer, name, norm)
    return layer


def default_rotary(config) -> Rotary:
    """transformers' default rope for the head's shape: its inverse frequencies, computed as
    LlamaRotaryEmbedding.compute_default_rope_parameters computes them."""
    rope = config.rope_parameters
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"rope type {rope['rope_type']!r}")
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    rotary = Rotary()
    rotary.inv_freq, rotary.original_inv_freq = inv_freq, inv_freq.clone()
    return rotary
