"""The lean forward of Gemma 3's text model (``Gemma3ForCausalLM``, model_type gemma3_text) and of
Gemma 2: what transformers' modeling_gemma3 and modeling_gemma2 compute, op for op, on the quantised
kernels.

Where it differs from Llama's layer (lean_decoder.py), and is computed here as transformers does:
the embedding scaled by √hidden (the embedding's own ``embed_scale`` buffer); RMSNorm as
``normed · (1 + w)`` in float32; q and k normed per head before the rope; attention scaled by
``query_pre_attn_scalar``; sliding layers (``layer_types``) with their own rope and a window over a
cache that keeps every position (lean_decoder.window_seen); the attention output and the MLP's each
normed before their residual add (post-attention, pre- and post-feedforward norms); a tanh-GELU
gated MLP; and the logits soft-capped where the config says.

Gemma 2 has no q/k norms and one rope for both kinds of layer, and soft-caps its attention logits,
which neither SDPA nor specdec's attention op do: every row attends alone in eager attention's
arithmetic (rowwise_attention.softcapped_one_query), a prompt's rows too, on either kernels, as
transformers' forward does under specdec's rowwise attention.
"""

from __future__ import annotations

import torch

from .lean_forward import LeanLlama
from .lean_decoder import window_seen
from .lean_weights import fused, kernel, qkv_kernel
from .rowwise_attention import sdpa_rows


def gemma_norm(x, weight_plus_one, eps):
    """Gemma's RMSNorm on float32 ``x``, given 1 + its weight (``norm_of`` makes it once)."""
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)) * weight_plus_one


def norm_of(module) -> tuple[torch.Tensor, float]:
    """A Gemma RMSNorm's (1 + weight, eps): the sum its forward makes at every call, made once."""
    return 1.0 + module.weight.float(), module.eps


def gemma_layer_weights(layer, config) -> tuple:
    """A quantised Gemma 2 or 3 decoder layer's norms (as (1 + w, eps)) and kernels, as ``LeanGemma.layer_rows`` reads them."""
    attention, mlp = layer.self_attn, layer.mlp
    return (norm_of(layer.input_layernorm), qkv_kernel(attention, gemma_norm, norm_of), kernel(attention.o_proj),
            norm_of(layer.post_attention_layernorm), norm_of(layer.pre_feedforward_layernorm),
            kernel(fused(mlp.gate_up_proj)), kernel(mlp.down_proj), norm_of(layer.post_feedforward_layernorm),
            config.intermediate_size)


class LeanGemma(LeanLlama):
    """Gemma 3's text model: LeanLlama's forward (caches, masks, trees, hidden states, several
    answers) around Gemma's own embedding, layers, final norm and logits."""

    def __init__(self, model, dense=None):
        """``dense``: none (dense_prefill.py copies Llama's layers only)."""
        if dense is not None:
            raise ValueError("dense prompt copies are Llama's; Gemma's prompts run on the kernels")
        super().__init__(model)
        config = model.config
        self.scaling = config.query_pre_attn_scalar**-0.5
        self.embed_scale = model.model.embed_tokens.embed_scale.to(self.embed_dtype)
        self.softcap = config.final_logit_softcapping

    @staticmethod
    def weights_of(layer, config) -> tuple:
        return gemma_layer_weights(layer, config)

    norm_of = staticmethod(norm_of)

    def kind_rotary(self, kind: str):
        """Gemma's rotary module takes the layer type: sliding and full layers have their own frequencies."""
        return lambda x, positions: self.rotary(x, positions, kind)

    def embedded(self, ids) -> torch.Tensor:
        return self.embed_rows(ids) * self.embed_scale

    def final_norm(self, x) -> torch.Tensor:
        return gemma_norm(x, *self.final)

    def logits(self, hidden) -> torch.Tensor:
        logits = self.head(hidden)
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap

    def layer_rows(self, x, weights, index, cos, sin, parts):
        """One Gemma 2 or 3 decoder layer on the rows of ``parts`` (as LeanDecoder.layer_rows)."""
        norm1, qkv, o_proj, post_attention, pre_feedforward, gate_up, down, post_feedforward, inner = weights
        rows = x.shape[0]
        heads = qkv(gemma_norm(x, *norm1)).view(rows, self.heads + 2 * self.kv_heads, self.head_dim)
        attended = self.attention(heads, cos, sin, index, parts).reshape(rows, -1)
        x = x + gemma_norm(o_proj(attended), *post_attention)
        both = gate_up(gemma_norm(x, *pre_feedforward))
        mixed = torch.nn.functional.gelu(both[:, :inner], approximate="tanh") * both[:, inner:]
        return x + gemma_norm(down(mixed), *post_feedforward)


class LeanGemma2(LeanGemma):
    """Gemma 2: Gemma 3's layers without q/k norms (qkv_kernel finds none), one rotary module, and
    soft-capped attention logits."""

    def __init__(self, model, dense=None):
        super().__init__(model, dense)
        self.attention_softcap = model.config.attn_logit_softcapping
        self.cached_op = self.cached_op and self.attention_softcap is None  # soft-capped rows attend alone (below)

    def kind_rotary(self, kind: str):
        return self.rotary

    def attend_answers(self, answers: list) -> torch.Tensor:
        if self.attention_softcap is None:
            return super().attend_answers(answers)
        found = [sdpa_rows(query, key, value, self.scaling, self.groups, seen, self.attention_softcap)[0]
                 for query, key, value, seen in answers]
        return found[0] if len(found) == 1 else torch.cat(found)

    def attend_prompt(self, query, key, value, window: int | None = None):
        """A prompt's rows each alone, as transformers' soft-capped rowwise attention runs them."""
        if self.attention_softcap is None:
            return super().attend_prompt(query, key, value, window)
        return self.attend_answers([(query, key, value, window_seen(query.shape[2], key.shape[2], window))])
