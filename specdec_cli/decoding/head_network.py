"""A feature-level draft head's network (EAGLE-style): what training makes, the drafter runs
(drafters/head.py) and export converts.

The head reads what the target already computed: at position t its input is the embedding of token
t concatenated with the target's last hidden state (post-norm) at t − 1; a linear layer folds the
two into one vector, one Llama decoder layer with its own small KV cache refines it into a guess of
the target's hidden state at t, and the target's own (frozen) lm_head turns that into logits. To
draft K tokens it feeds its own guesses back in place of the target's states. Only the fc and the
decoder layer are trained and saved (a few MB, head_files.py); embedding and lm_head are borrowed from
the target, which is why a head is tied to the one target it was trained for.

A fused head (meta ``format`` 2, EAGLE-3) reads several of the target's hidden states instead of the
last one: ``feature_layers`` indexes transformers' ``hidden_states`` (-1 is the last, post-norm),
and a linear ``fuse`` folds their concatenation to one H-wide feature for the confirmed positions;
the positions it drafts feed back its own H-wide guess in place of that. A head without
``feature_layers`` in its meta (format 1) reads the last hidden state alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ..runtime.lean_forward import LeanDecoder
from ..runtime.lean_weights import layer_supported, layer_weights
from ..runtime.reserved_cache import appends
from ..runtime.rowwise_attention import ROWWISE_UP_TO, visible_keys
from .head_layer import default_rotary, layer_config, layer_skeleton

TOP_ONLY = (-1,)  # the feature layers of a head that reads the target's last hidden state alone

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class DraftHead(nn.Module):
    def __init__(self, layer: dict, feature_layers: tuple[int, ...] = TOP_ONLY, skeleton: bool = False):
        """``layer``: LlamaConfig fields of the decoder layer (see ``head_config``), saved with the weights;
        ``feature_layers``: the target's hidden states it reads (indices into ``hidden_states``);
        ``skeleton``: the layer's parameters without transformers' classes, on the meta device until
        weights are assigned (head_layer.py), for a head loaded to draft quantised."""
        super().__init__()
        self.config_dict = dict(layer)
        self.feature_layers = tuple(int(i) for i in feature_layers)
        if skeleton:
            config = layer_config(layer)
        else:
            from transformers import LlamaConfig

            config = LlamaConfig(**layer)
            config._attn_implementation = "sdpa"
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden)
        width = len(self.feature_layers) * hidden
        self.fuse = nn.Linear(width, hidden, bias=False) if len(self.feature_layers) > 1 else None
        if skeleton:
            self.layer, self.rotary = layer_skeleton(config), default_rotary(config)
        else:
            from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

            self.layer = LlamaDecoderLayer(config, layer_idx=0)
            self.rotary = LlamaRotaryEmbedding(config)
        self.skeleton = skeleton
        self.lean: tuple | None = None

    def go_lean(self, native: bool = False) -> None:
        """Once quantised (fused q/k/v and gate/up): run the decoder layer as lean_forward's flat
        function, without transformers' per-call dispatch, which is most of a chain step; ``native``:
        its attention on specdec's op, as its linears. A skeleton has no other layer to run: one the
        lean layer cannot run is refused here, at load time."""
        if layer_supported(self.layer):
            self.lean = (LeanDecoder(self.config, native), layer_weights(self.layer, self.config.intermediate_size))
        elif self.skeleton:
            raise ValueError("the draft head's layer is not a fused, quantised Llama layer without biases")

    def fused(self, features: torch.Tensor) -> torch.Tensor:
        """The target's (concatenated) hidden states → the H-wide feature the head reads."""
        return features if self.fuse is None else self.fuse(features)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, cache=None, start: int = 0,
                positions: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, positions, H) embeddings and previous-position H-wide features (``fused`` target
        states, or the head's own guesses) → guessed features.

        Consecutive positions from ``start`` under a causal mask; or, for a tree level, the given
        ``positions`` (1, n) and 4D bool ``mask`` (decoding/tree.py's layout).
        """
        x = self.fc(torch.cat([embeds, features], dim=-1))
        if positions is None:
            positions = torch.arange(start, start + x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        if self.lean is not None:
            return self.lean_forward(x, positions, cache, mask)
        from transformers.masking_utils import create_causal_mask

        if mask is None:
            mask = create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=None, cache=cache,
                                      position_ids=positions)
        return self.layer(x, attention_mask=mask, position_ids=positions, cache=cache, use_cache=cache is not None,
                          position_embeddings=self.rotary(x, positions))

    def lean_forward(self, x: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor | None) -> torch.Tensor:
        """The quantised layer on every block a drafter gives it, so that nothing is built or imported
        mid-decode: each row attends alone (rowwise_attention.py), a tree level's rows to their
        ancestors, and a catch-up longer than ``ROWWISE_UP_TO`` rows (after a long prompt, or after
        rounds the head sat out) in one causal call, as transformers' layer ran it."""
        if x.shape[0] != 1 or not appends(cache):
            raise ValueError("a quantised draft head drafts one sequence at a time, on a cache that appends "
                             "(kv.reserved_cache)")
        decoder, weights = self.lean
        rows, past = x.shape[1], cache.get_seq_length()
        seen = None if mask is None else visible_keys(mask, rows, past + rows)
        prompt = mask is None and rows > ROWWISE_UP_TO
        cos, sin = decoder.rotary_tables(self.rotary, x, positions)
        return decoder.layer(x[0], weights, 0, cos, sin, cache, seen, prompt)[None]


def head_config(target: PreTrainedModel) -> dict:
    """The decoder layer's shape, taken from the target's so that its features fit (saved as JSON)."""
    c = target.config.get_text_config()
    hidden = c.hidden_size
    heads = getattr(c, "num_attention_heads", None) or max(1, hidden // 64)
    rope = getattr(c, "rope_parameters", None)
    if not (isinstance(rope, dict) and "rope_type" in rope):
        rope = {"rope_type": "default", "rope_theta": float(getattr(c, "rope_theta", 10000.0))}
    return {
        "vocab_size": c.vocab_size, "hidden_size": hidden, "num_hidden_layers": 1,
        "intermediate_size": getattr(c, "intermediate_size", None) or 4 * hidden,
        "num_attention_heads": heads, "num_key_value_heads": getattr(c, "num_key_value_heads", None) or heads,
        "head_dim": getattr(c, "head_dim", None) or hidden // heads, "rms_norm_eps": getattr(c, "rms_norm_eps", 1e-6),
        "max_position_embeddings": getattr(c, "max_position_embeddings", 4096), "rope_parameters": dict(rope),
    }


def head_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The target's lm_head applied to (guessed) features; ``weight`` may hold only the allowed rows."""
    return F.linear(hidden, weight.to(hidden.dtype))
