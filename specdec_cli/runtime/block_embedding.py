"""A quantised target's token embedding in its GGUF's own blocks, its rows de-quantised as they are
looked up: the float32 values the file's de-quantisation gives, bit for bit, in the bytes the file
takes (a Q8_0 table is a quarter of its float32 one: 400 MB of a 1.7B model's 1.4 GB otherwise).

The blocks are gguf_blocks.FileBlocks' (``scale * code + offset`` per group of inputs), stored as
native_kernels.compact stores a linear's: float16 scales where the file's are, an offset that is a
fixed multiple of its scale as that multiple.
"""

from __future__ import annotations

import torch
from torch import nn

from .gguf_blocks import FileBlocks
from .native_kernels import compact


class BlockEmbedding(nn.Module):
    """An embedding table of ``codes`` (uint8 [vocab, hidden]) with a ``scale`` and ``offset`` per
    group of inputs ([vocab, hidden / group], or the offset one multiple of the scale). A Gemma
    embedding's ``embed_scale`` is kept and applied as its own module applies it."""

    def __init__(self, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                 embed_scale: torch.Tensor | None = None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = codes.shape
        self.register_buffer("codes", codes)
        self.register_buffer("scale", scale)
        self.register_buffer("offset", offset)
        self.register_buffer("embed_scale", embed_scale, persistent=False)

    @classmethod
    def from_blocks(cls, blocks: FileBlocks, replaced: nn.Module) -> "BlockEmbedding":
        """The embedding ``replaced`` (its float table the de-quantisation of ``blocks``) in ``blocks``."""
        return cls(blocks.codes.contiguous(), *compact(blocks.scale, blocks.offset), getattr(replaced, "embed_scale", None))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The float32 rows of ``ids`` ([*ids.shape, hidden]), by the ops FileBlocks.values does (a multiply, then an add)."""
        codes = self.codes[ids]
        groups = self.scale.shape[1]
        grouped = codes.float().view(-1, groups, self.embedding_dim // groups)
        scale = self.scale[ids].float().view(-1, groups, 1)
        offset = scale * self.offset if self.offset.numel() == 1 else self.offset[ids].float().view(-1, groups, 1)
        return (grouped * scale + offset).view(codes.shape)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = self.rows(ids)
        return rows if self.embed_scale is None else rows * self.embed_scale.to(rows.dtype)

    @property
    def weight(self) -> torch.Tensor:
        """The whole table in float32, de-quantised afresh (for training, export and a draft head's
        scoring rows: what reads the whole table, once)."""
        return self.rows(torch.arange(self.num_embeddings))


def embedding_rows(embedding: nn.Module):
    """``ids -> float rows`` of a target's input embedding, without its embed_scale (the lean forward applies that)."""
    return embedding.rows if isinstance(embedding, BlockEmbedding) else embedding.weight.__getitem__


def embedding_dtype(embedding: nn.Module) -> torch.dtype:
    return torch.float32 if isinstance(embedding, BlockEmbedding) else embedding.weight.dtype


def embedding_device(embedding: nn.Module) -> torch.device:
    return embedding.codes.device if isinstance(embedding, BlockEmbedding) else embedding.weight.device
