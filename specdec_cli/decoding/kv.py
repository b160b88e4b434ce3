"""KV-cache rollback and device placement, the two places where the engine touches model internals."""

from __future__ import annotations

import torch
from transformers import Cache, PreTrainedModel


def crop_cache(cache: Cache, length: int) -> None:
    """Drop cached positions past ``length``: the rejected drafts' keys and values.

    transformers >= 5 crops by a negative count of positions to remove; nothing is recomputed.
    """
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


def input_device(model: PreTrainedModel) -> torch.device:
    """Where a model's input ids must go; with an accelerate device map that is the embedding's device."""
    return model.get_input_embeddings().weight.device
