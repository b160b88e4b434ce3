"""Attention that scores each query row alone, so that a K + 1-token verify block computes every
position exactly as a one-token forward does.

With weight-only int8/int4 linears every other op of a decoder layer already gives each row the
same result whatever the block length (the kernels are row-independent; norms and element-wise
ops work per row); the attention kernels do not, and their float round-off, re-rounded to bfloat16
at the next linear, flips near-tied greedy tokens (logits moved by up to ~0.4 here). Running each
of a short block's rows as a one-query call over its own prefix — the very call a one-token
forward makes — removes the difference. Long inputs (a prompt) take the ordinary kernel: they
are computed the same way in plain and speculative decoding.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "specdec_rowwise"
ROWWISE_UP_TO = 64  # query rows; verify blocks are at most MAX_K + 1


def rowwise_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    rows, keys = query.shape[2], key.shape[2]
    if rows > ROWWISE_UP_TO or query.shape[0] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    visible = _visible(attention_mask, rows, keys)
    outputs = []
    for row in range(rows):
        if visible is not None:  # a token tree (decoding/tree.py): the cache and the row's ancestors
            index = visible[row].nonzero()[:, 0].to(key.device)
            k, v = key.index_select(2, index), value.index_select(2, index)
        else:
            seen = keys - rows + row + 1  # this row's prefix: causal, batch of one, no padding
            k = key[:, :, :seen].contiguous() if seen < keys else key
            v = value[:, :, :seen].contiguous() if seen < keys else value
        out, _ = sdpa_attention_forward(module, query[:, :, row : row + 1].contiguous(), k, v, None,
                                        dropout=dropout, scaling=scaling, is_causal=False)
        outputs.append(out)
    return torch.cat(outputs, dim=1), None


def _visible(attention_mask, rows: int, keys: int) -> torch.Tensor | None:
    """[rows, keys] bool of the keys each row may see, when the mask is not plain causal (a tree's);
    None for a causal block, whose rows keep the contiguous prefix a one-token forward sees.

    A tree node sees the cache and its ancestors; gathered in block order (parents come first) they
    are the very keys the path run alone would hold, so the node's scores are a one-token forward's.
    """
    global _last
    if rows == 1 or not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 4:
        return None  # one row sees every key; no mask is causal
    if _last[0] is attention_mask:  # every layer of a forward gets the same mask: looked at once
        return _last[1]
    mask = attention_mask[0, 0, -rows:, -keys:]
    visible = mask if mask.dtype == torch.bool else mask == 0
    causal = torch.ones(rows, keys, dtype=torch.bool, device=visible.device).tril(keys - rows)
    _last = (attention_mask, None if torch.equal(visible, causal) else visible.cpu())
    return _last[1]


_last: tuple = (None, None)  # the last mask seen and what it lets each row see


AttentionInterface.register(NAME, rowwise_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, sdpa_mask)  # long inputs go to sdpa with its own mask


def use_rowwise_attention(model) -> None:
    model.set_attn_implementation(NAME)
