"""A KV cache whose layers update in place, and the cache of a model loaded without transformers.

transformers' DynamicLayer concatenates on every update, copying the whole cache: per token that is
context × 46 KB for this project's target (30 layers, 3 KV heads), some 23 MB at 500 tokens, which
a one-token forward of an int4 target (~80 MB of weights) feels. ``ReservedLayer`` writes only the
new positions into a buffer with room to grow. A crop keeps prefix views of the buffers; keys
replaced by anything else (a tree's kept path, gathered) seed new buffers on the next update. The
attention kernels read the same values through a strided view, so results are unchanged. On specdec's
kernels a batch's forward writes every answer's new positions itself (``make_room``, the op
attend_cached into ``planes``, ``extend``): one call a layer instead of a copy and views an answer.

A target loaded for the lean forward alone (lean_model.py) is read by nothing of transformers, so
its cache is ``ReservedCache``: DynamicCache's update, length and crop, on these layers, without
importing transformers (a second, at every start). A model of transformers' own gets a DynamicCache
of the same layers (decoding/kv.py), which its forward can take.
"""

from __future__ import annotations

import sys

import torch

RESERVE_STEP = 256  # positions a reserved layer grows by, at least


def held_view(name: str, index: int) -> property:
    """A reserved layer's ``keys`` (buffer 0) or ``values`` (1): while the cached positions are the
    buffers' first ``length`` (``on_buffers``), that buffer's view, made when read; set from outside,
    held as given."""
    private = f"_{name}"

    def read(layer: "ReservedLayer") -> torch.Tensor | None:
        if getattr(layer, private) is None and layer.on_buffers:
            setattr(layer, private, layer.buffers[index].narrow(-2, 0, layer.length))
        return getattr(layer, private)

    def write(layer: "ReservedLayer", tensor: torch.Tensor | None) -> None:
        layer._off_buffers()
        setattr(layer, private, tensor)

    return property(read, write)


class ReservedLayer:
    """DynamicLayer's keys, values, update, length and crop (transformers' semantics), updated in place.

    While the cached positions are the buffers' first ``length`` (``on_buffers``), ``keys`` and
    ``values`` are views made when they are read: a batch's forward moves every layer of every answer
    (``extend``), and two views a layer an answer cost it about as much as its attention. Keys and
    values set from outside (transformers, a tree's kept path) are held as given until the next update
    copies them into buffers."""

    def __init__(self, *args, **kwargs):
        self._keys = self._values = None
        self.on_buffers, self.length = False, 0
        super().__init__(*args, **kwargs)  # transformers' layer, in the class kv.py builds on both
        self.keys = self.values = None
        self.is_initialized = False

    keys = held_view("keys", 0)
    values = held_view("values", 1)

    def _off_buffers(self) -> None:
        """Keys or values are set from outside: both are held as tensors from now on."""
        if self.on_buffers:
            self._keys, self._values = self.keys, self.values
            self.on_buffers = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.keys = torch.tensor([], dtype=key_states.dtype, device=self.device)
        self.values = torch.tensor([], dtype=value_states.dtype, device=self.device)
        self.is_initialized = True
        self.buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self.planes: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        length = self.make_room(new, (key_states, value_states))
        key_buffer, value_buffer = self.buffers
        key_buffer.narrow(-2, length, new).copy_(key_states)
        value_buffer.narrow(-2, length, new).copy_(value_states)
        self.extend(length + new)
        return self.keys, self.values

    def make_room(self, new: int, like: tuple[torch.Tensor, torch.Tensor] | None = None) -> int:
        """Buffers with room for ``new`` positions after the cached ones, which they hold; the cached
        count. ``like``: tensors of the buffers' shape, where the cached keys are none yet."""
        length = self.get_seq_length()
        if not self.on_buffers or length + new > self.buffers[0].shape[-2]:
            self._reserve(length, length + new, like or (self.keys, self.values))
        return length

    def extend(self, length: int) -> None:
        """The cached positions are the buffers' first ``length``: those before, and new ones written in place."""
        self.length, self.on_buffers = length, True
        self._keys = self._values = None

    def get_seq_length(self) -> int:
        if self.on_buffers:
            return self.length
        if not self.is_initialized or self._keys is None or self._keys.numel() == 0:
            return 0
        return self._keys.shape[-2]

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` positions (a negative count, as transformers >= 5 takes it)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to remove, got {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        if self.on_buffers:  # a prefix of the buffers still
            self.extend(max(0, self.length + tokens_to_remove))
            return
        self._keys = self._keys[..., :tokens_to_remove, :]
        self._values = self._values[..., :tokens_to_remove, :]

    def _reserve(self, length: int, need: int, like: tuple[torch.Tensor, torch.Tensor]) -> None:
        """New buffers shaped as ``like`` with room for ``need`` positions and more, holding the
        first ``length`` cached ones (whatever tensors ``keys`` and ``values`` now are)."""
        room = RESERVE_STEP * -(-(need * 3 // 2) // RESERVE_STEP)
        buffers = tuple(t.new_empty((*t.shape[:-2], room, t.shape[-1])) for t in like)
        if length:
            for buffer, t in zip(buffers, (self.keys, self.values)):
                buffer.narrow(-2, 0, length).copy_(t)
        self.buffers = buffers
        # [kv heads, room, dim], as specdec's attention op writes a batch of one's new positions (attend_cached)
        self.planes = tuple(b[0] for b in buffers) if buffers[0].dim() == 4 and buffers[0].shape[0] == 1 else None
        self.extend(length)


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
