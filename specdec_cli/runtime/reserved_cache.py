"""A KV cache whose layers update in place, and the cache of a model loaded without transformers.

transformers' DynamicLayer concatenates on every update, copying the whole cache: per token that is
context × 46 KB for this project's target (30 layers, 3 KV heads), some 23 MB at 500 tokens, which
a one-token forward of an int4 target (~80 MB of weights) feels. ``ReservedLayer`` writes only the
new positions into a buffer with room to grow. A crop keeps prefix views of the buffers; keys
replaced by anything else (a tree's kept path, gathered) seed new buffers on the next update. The
attention kernels read the same values through a strided view, so results are unchanged.

A target loaded for the lean forward alone (lean_model.py) is read by nothing of transformers, so
its cache is ``ReservedCache``: DynamicCache's update, length and crop, on these layers, without
importing transformers (a second, at every start). A model of transformers' own gets a DynamicCache
of the same layers (decoding/kv.py), which its forward can take.
"""

from __future__ import annotations

import sys

import torch

RESERVE_STEP = 256  # positions a reserved layer grows by, at least


class ReservedLayer:
    """DynamicLayer's keys, values, update, length and crop (transformers' semantics), updated in place."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)  # transformers' layer, in the class kv.py builds on both
        self.keys = self.values = None
        self.is_initialized = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.keys = torch.tensor([], dtype=key_states.dtype, device=self.device)
        self.values = torch.tensor([], dtype=value_states.dtype, device=self.device)
        self.is_initialized = True
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

    def get_seq_length(self) -> int:
        if not self.is_initialized or self.keys.numel() == 0:
            return 0
        return self.keys.shape[-2]

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` positions (a negative count, as transformers >= 5 takes it)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to remove, got {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        views = self.keys is self.handed[0] and self.values is self.handed[1]
        self.keys = self.keys[..., :tokens_to_remove, :]
        self.values = self.values[..., :tokens_to_remove, :]
        if views:
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


class ReservedCache:
    """What the engine and the lean forward use of transformers' DynamicCache, one reserved layer a
    decoder layer."""

    def __init__(self, layers: int):
        self.layers = [ReservedLayer() for _ in range(layers)]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        return self.layers[layer_idx].update(key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].get_seq_length() if layer_idx < len(self.layers) else 0

    def crop(self, tokens_to_remove: int) -> None:
        for layer in self.layers:
            layer.crop(tokens_to_remove)

    def __len__(self) -> int:
        return len(self.layers)


def appends(cache) -> bool:
    """Whether the lean forward may write to ``cache``: a ReservedCache, or transformers' DynamicCache
    (whose layers append), told apart without importing transformers: one exists only once it is loaded."""
    if type(cache) is ReservedCache:
        return True
    cache_utils = sys.modules.get("transformers.cache_utils")
    return cache_utils is not None and type(cache) is cache_utils.DynamicCache
