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


def keep_positions(cache: Cache, keep: torch.Tensor) -> None:
    """Keep only the cached positions ``keep`` (ascending): the accepted path of a tree round.

    Keys are stored after rotation at their final positions (a tree node sits at cache length +
    depth), so gathering them is exact. A prefix is cropped instead, which copies nothing.
    """
    length = cache.get_seq_length()
    if torch.equal(keep.cpu(), torch.arange(keep.shape[0])):
        crop_cache(cache, keep.shape[0])
        return
    if int(keep.max()) >= length:
        raise ValueError(f"position {int(keep.max())} is not cached ({length} are)")
    for layer in cache.layers:
        index = keep.to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, index)
        layer.values = layer.values.index_select(-2, index)
