"""KV-cache rollback and device placement, the two places where the engine touches model internals."""

from __future__ import annotations

import torch
from typing import TYPE_CHECKING

from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

if TYPE_CHECKING:
    from transformers import PreTrainedModel

RESERVE_STEP = 256  # positions a reserved layer grows by, at least


class ReservedLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of a buffer with room to grow.

    transformers' layer concatenates on every update, copying the whole cache: per token that is
    context × 46 KB for this project's target (30 layers, 3 KV heads), some 23 MB at 500 tokens,
    which a one-token forward of an int4 target (~80 MB of weights) feels. Here an update writes
    only the new positions. A crop keeps prefix views of the buffers; keys replaced by anything
    else (a tree's kept path, gathered) seed new buffers on the next update.
    The attention kernels read the same values through a strided view, so results are unchanged.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self.handed = (None, None)  # the views last made of the buffers: identity says they still are

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        keys, values = self.keys, self.values
        length, new = self.get_seq_length(), key_states.shape[-2]
        if not (keys is self.handed[0] and values is self.handed[1]) or length + new > self.buffers[0].shape[-2]:
            self._reserve(length, length + new, (key_states, value_states))
        key_buffer, value_buffer = self.buffers
        key_buffer.narrow(-2, length, new).copy_(key_states)
        value_buffer.narrow(-2, length, new).copy_(value_states)
        self.keys, self.values = self.handed = key_buffer.narrow(-2, 0, length + new), value_buffer.narrow(-2, 0, length + new)
        return self.keys, self.values

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        if self.is_initialized:
            self.handed = (self.keys, self.values)  # prefix views of the buffers still

    def _reserve(self, length: int, need: int, like: tuple[torch.Tensor, torch.Tensor]) -> None:
        """New buffers shaped as ``like`` with room for ``need`` positions and more, holding the
        first ``length`` cached ones (whatever tensors ``keys`` and ``values`` now are)."""
        room = RESERVE_STEP * -(-(need * 3 // 2) // RESERVE_STEP)
        buffers = tuple(t.new_empty((*t.shape[:-2], room, t.shape[-1])) for t in like)
        if length:
            for buffer, t in zip(buffers, (self.keys, self.values)):
                buffer.narrow(-2, 0, length).copy_(t)
        self.buffers = buffers


def reserved_cache(config) -> DynamicCache:
    """A DynamicCache for ``config`` whose layers update in place (``ReservedLayer``); it is still a
    DynamicCache, so transformers' generate and the lean forward take it as one."""
    cache = DynamicCache(config=config)
    if all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [ReservedLayer() for _ in cache.layers]
    return cache


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
