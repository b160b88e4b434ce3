"""A draft model (``model``): a small causal LM sharing the target's tokenizer, drafting with its own
KV cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..control.gate import DraftGate
from ..kv import crop_cache, input_device, reserved_cache
from .base import Draft, Drafter, autoregress, common_prefix

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class ModelDrafter(Drafter):
    """A small causal LM drafting autoregressively with its own KV cache.

    The cache is kept across rounds and cropped to the longest prefix it shares with the new
    context, so accepted tokens are never recomputed.
    """

    name = "model"

    def __init__(self, model: PreTrainedModel, vocab_size: int, allowed: torch.Tensor | None = None):
        self.model = model
        # The target's vocabulary size: draft logits are cut or padded to it so that p and q
        # range over the same ids (checkpoints often pad their embedding matrices differently).
        self.vocab_size = vocab_size
        self.outside = None if allowed is None else ~vocab_mask(allowed, vocab_size)
        self.reset()

    def reset(self) -> None:
        self.cache = reserved_cache(self.model.config)
        self.cached_tokens = torch.empty(0, dtype=torch.long)

    @torch.inference_mode()
    def propose(self, context, k, sampling, noise, gate: DraftGate | None = None) -> Draft:
        if k <= 0:
            return Draft.empty()
        keep = min(common_prefix(self.cached_tokens, context), context.shape[0] - 1)
        crop_cache(self.cache, keep)
        draft = autoregress(self._forward(context[keep:]), lambda token: self._forward(token.view(1)), k, sampling,
                            noise, start=context.shape[0], gate=gate)
        draft.source = self.name
        self.cached_tokens = torch.cat([context, draft.tokens[:-1]])
        return draft

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        device = input_device(self.model)
        out = self.model(ids.view(1, -1).to(device), cache=self.cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[0, -1].float()
        if logits.shape[0] >= self.vocab_size:
            logits = logits[: self.vocab_size]
        else:
            logits = torch.cat([logits, logits.new_full((self.vocab_size - logits.shape[0],), float("-inf"))])
        return logits if self.outside is None else logits.masked_fill(self.outside.to(logits.device), float("-inf"))


def vocab_mask(allowed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Boolean mask of the ids a restricted output layer (--top-vocab) can propose.

    Outside it the draft's logits are -inf, so q is zero there; sampling stays lossless because the
    residual norm(max(0, p - q)) then equals p outside the set: the target alone decides there.
    """
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[allowed[allowed < vocab_size].long()] = True
    return mask
