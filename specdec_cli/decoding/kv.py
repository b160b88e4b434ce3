"""KV-cache rollback and device placement, the two places where the engine touches model internals."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from ..runtime.block_embedding import embedding_device
from ..runtime.lean_model import LeanConfig
from ..runtime.reserved_cache import ReservedCache, ReservedLayer

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.cache_utils import Cache, DynamicCache


def reserved_cache(config) -> ReservedCache | DynamicCache:
    """A cache for a model of ``config`` whose layers update in place (runtime/reserved_cache.py): for
    a model loaded without transformers (its config a LeanConfig) a ReservedCache; else a DynamicCache
    of such layers, which transformers' forward and generate take as one, and so does the lean forward.

    Every layer keeps every position, sliding-window layers too (Mistral, Gemma 2 and 3): transformers'
    sliding layers drop what falls out of the window, so a rejected draft past it could not be rolled
    back; the attention mask, built from the config's window, still hides what the window hides."""
    if isinstance(config, LeanConfig):
        return ReservedCache(config.num_hidden_layers)
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache(config=config)
    cache.layers = [transformers_layer()() for _ in cache.layers]
    return cache


@functools.cache
def transformers_layer() -> type:
    """ReservedLayer as a transformers cache layer (a DynamicLayer), made once where one is needed."""
    from transformers.cache_utils import DynamicLayer

    return type("ReservedDynamicLayer", (ReservedLayer, DynamicLayer), {"__module__": __name__})


def crop_cache(cache: Cache, length: int) -> None:
    """Drop cached positions past ``length``: the rejected drafts' keys and values.

    transformers >= 5 crops by a negative count of positions to remove; nothing is recomputed.
    """
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


def input_device(model: PreTrainedModel) -> torch.device:
    """Where a model's input ids must go; with an accelerate device map that is the embedding's device."""
    return embedding_device(model.get_input_embeddings())


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


def keep_rows(cache: Cache, cached: int, rows: list[int]) -> None:
    """Keep the first ``cached`` positions and, of the verify block after them, the ``rows`` listed
    (ascending, the root 0 first): a chain's, or a tree path's that is the block's prefix, are cropped,
    which copies nothing; a tree's path off the prefix is gathered (``keep_positions``)."""
    if rows[-1] == len(rows) - 1:
        crop_cache(cache, cached + len(rows))
    else:
        keep_positions(cache, torch.cat([torch.arange(cached), cached + torch.tensor(rows, dtype=torch.long)]))


def context_length(model: PreTrainedModel) -> int | None:
    """The most positions the model's configuration says it holds, when it says."""
    return getattr(model.config.get_text_config(), "max_position_embeddings", None)
