"""Attention that scores each query row alone, so that a K + 1-token verify block computes every
position exactly as a one-token forward does.

With weight-only int8/int4 linears every other op of a decoder layer already gives each row the
same result whatever the block length (the kernels are row-independent; norms and element-wise
ops work per row); the attention kernels do not, and their float round-off, re-rounded to bfloat16
at the next linear, flips near-tied greedy tokens (docs/precision.md says by how much). Running each
of a short block's rows as a one-query call over the keys it may see — the very call a one-token
forward makes — removes the difference. A row's keys are its causal prefix, or, under a tree's
mask, the cache and its ancestors gathered in order: what the cache holds once the path is kept.
Long inputs (a prompt) take the ordinary kernel: they are computed the same way in plain and
speculative decoding.

A target on specdec's own kernels (quantize.Q8Linear) attends with their attention op instead
(native/attention_rows.cpp): the same one-query arithmetic for every row, but all rows of a block in
one call, and a fixed order of float ops of its own (a one-token forward runs it too). It is chosen
with the linears' kernel when the model is loaded (``native``), never per call.
"""

from __future__ import annotations

from functools import lru_cache, partial

import torch

from . import native_kernels

# The attention implementations registered with transformers: one SDPA call a row, or specdec's op.
SDPA_ROWS = "specdec_rowwise"
NATIVE_ROWS = "specdec_native_rows"
ROWWISE_UP_TO = 64  # query rows; verify blocks are at most MAX_K + 1
# On specdec's op, where a row costs about what it costs in a causal call up to here: a prompt's
# positions below it attend row by row, so that batched prompts may share them (lean_forward.is_prompt).
NATIVE_ROWWISE_UP_TO = 128


def one_query(query, key, value, scaling, groups: int) -> torch.Tensor:
    """[1, heads, 1, dim] against all of ``key``: the call a one-token forward makes (transformers'
    SDPA path for one query and no mask: GQA inside the kernel), as [1, 1, heads, dim]."""
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=scaling, enable_gqa=groups > 1)
    return out.transpose(1, 2)


def softcapped_one_query(query, key, value, scaling, groups: int, softcap: float) -> torch.Tensor:
    """What ``one_query`` computes for a model that soft-caps its attention logits (Gemma 2), where SDPA
    cannot: transformers' eager attention for one query and no mask, op for op, as [1, 1, heads, dim]."""
    if groups > 1:  # transformers' repeat_kv
        key, value = (t[:, :, None].expand(t.shape[0], t.shape[1], groups, *t.shape[2:]).reshape(
            t.shape[0], t.shape[1] * groups, *t.shape[2:]) for t in (key, value))
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    weights = torch.tanh(weights / softcap) * softcap
    weights = torch.nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2)


def visible_keys(mask: torch.Tensor | None, rows: int, keys: int) -> list[torch.Tensor | None]:
    """Per query row, the key positions it may see when they are not its causal prefix (a tree's
    mask), else None; ``mask``: [1, 1, rows, keys], bool (True = attend) or additive (0 = attend)."""
    if not isinstance(mask, torch.Tensor) or mask.dim() != 4:
        return [None] * rows
    seen = mask[0, 0, -rows:, -keys:]
    seen = seen if seen.dtype == torch.bool else seen == 0
    causal = torch.ones(rows, keys, dtype=torch.bool).tril(keys - rows)
    if torch.equal(seen, causal):
        return [None] * rows
    return [row.nonzero()[:, 0] for row in seen]


_last: list = [None, None]  # every layer of a forward gets the same mask: read it once


def visible_keys_once(mask: torch.Tensor | None, rows: int, keys: int) -> list[torch.Tensor | None]:
    if mask is None or mask is not _last[0]:
        _last[:] = mask, visible_keys(mask, rows, keys)
    return _last[1]


def native_rows(kernels: native_kernels.Kernels, query, key, value, scaling, seen: list | None = None) -> torch.Tensor:
    """What sdpa_rows computes, on specdec's attention op (attend_rows, all rows in one call):
    [1, heads, rows, dim] -> [1, rows, heads, dim]."""
    return native_answers(kernels, [(query, key, value, seen)], scaling)[None]


def native_answers(kernels: native_kernels.Kernels, answers: list, scaling) -> torch.Tensor:
    """Several answers' rows in one call of specdec's attention op, each against its own cache
    (batched decoding): per answer (query [1, heads, rows, dim], key, value [1, kv heads, keys, dim],
    seen) -> every answer's [rows, heads, dim] one after another, each as native_rows gives it alone."""
    queries, keys, values, counts, indices = [], [], [], [], []
    for query, key, value, seen in answers:
        count, index = row_keys(seen, query.shape[2], key.shape[2])
        queries.append(query[0].transpose(0, 1))
        keys.append(key[0])
        values.append(value[0])
        counts.append(count)
        indices.append(index)
    return kernels.attend_rows(queries, keys, values, counts, indices, scaling)


@lru_cache(maxsize=64)
def causal_counts(rows: int, keys: int) -> torch.Tensor:
    """Each causal row's key count, made once per shape: every layer of every forward reads it (never writes)."""
    return torch.arange(keys - rows + 1, keys + 1)


def row_keys(seen: list | None, rows: int, keys: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per row how many keys it sees, and which (None: its causal prefix), as the attention op takes them."""
    if not seen or all(gathered is None for gathered in seen):
        return causal_counts(rows, keys), None
    lists = [torch.arange(keys - rows + row + 1) if gathered is None else gathered for row, gathered in enumerate(seen)]
    counts = torch.tensor([len(keys_seen) for keys_seen in lists])
    index = torch.zeros(rows, int(counts.max()), dtype=torch.long)
    for row, keys_seen in enumerate(lists):
        index[row, : len(keys_seen)] = keys_seen
    return counts, index


def sdpa_rows(query, key, value, scaling, groups: int, seen: list | None = None, softcap: float | None = None) -> torch.Tensor:
    """[1, heads, rows, dim] -> [1, rows, heads, dim]: each query row as a one-query call over the keys
    it may see (``seen``: per row the gathered key positions, or None for its causal prefix); with a
    ``softcap``, each row's call is softcapped_one_query."""
    rows, keys = query.shape[2], key.shape[2]
    seen = seen or [None] * rows
    attend = one_query if softcap is None else partial(softcapped_one_query, softcap=softcap)
    if rows == 1 and seen[0] is None:  # a one-token forward
        return attend(query, key, value, scaling, groups)
    outputs = []
    for row, gathered in enumerate(seen):
        if gathered is None:
            visible = keys - rows + row + 1  # this row's prefix: causal, batch of one, no padding
            k, v = key[:, :, :visible], value[:, :, :visible]  # views: the kernel's result ignores strides
        else:
            k, v = key.index_select(2, gathered), value.index_select(2, gathered)
        outputs.append(attend(query[:, :, row : row + 1].contiguous(), k, v, scaling, groups))
    return torch.cat(outputs, dim=1)


def rowwise_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, kernels=None, **kwargs):
    """transformers' attention interface; ``kernels``: specdec's attention op (bound at load), else SDPA a row.
    Soft-capped attention (Gemma 2) has neither SDPA nor the op: every row of any input, prompts too,
    attends alone in eager attention's arithmetic (softcapped_one_query), on either kernels."""
    rows, keys = query.shape[2], key.shape[2]
    softcap = kwargs.get("softcap")
    if softcap is not None and query.shape[0] == 1 and not module.training:
        seen = None if attention_mask is None else visible_keys_once(attention_mask, rows, keys)
        return sdpa_rows(query, key, value, scaling, getattr(module, "num_key_value_groups", 1), seen, softcap), None
    limit = ROWWISE_UP_TO if kernels is None else NATIVE_ROWWISE_UP_TO
    # a long input on the op: its rows at positions below the limit (the lean forward's Rows.head)
    head = rows if rows <= limit else limit - (keys - rows)
    if query.shape[0] != 1 or module.training or (rows > limit and (kernels is None or head <= 0)):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    # transformers passes no mask to a one-token forward
    seen = None if attention_mask is None else visible_keys_once(attention_mask, rows, keys)
    groups = getattr(module, "num_key_value_groups", 1)
    if kernels is None:
        return sdpa_rows(query, key, value, scaling, groups, seen), None
    if head == rows:
        return native_rows(kernels, query, key, value, scaling, seen), None
    # a prompt past the limit: its first rows on the op, the rest in one causal call, as the lean forward
    visible = keys - rows + head
    first = native_rows(kernels, query[:, :, :head], key[:, :, :visible], value[:, :, :visible], scaling, seen and seen[:head])
    rest = causal_rows(query[:, :, head:], key, value, scaling, groups, kwargs.get("sliding_window"))
    return torch.cat([first, rest.transpose(1, 2)], dim=1), None


def causal_rows(query, key, value, scaling, groups: int, window: int | None = None) -> torch.Tensor:
    """[1, heads, rows, dim] -> [1, heads, rows, dim]: the last ``rows`` of ``key``'s positions attending
    causally in one SDPA call (a prompt's rows past those that attend row by row; the lean forward and
    transformers' forward on the op both call this). Within a ``window`` as long as the keys or shorter,
    under its mask, as transformers' SDPA call takes a mask: kv heads repeated."""
    rows, keys = query.shape[2], key.shape[2]
    if window is not None and keys >= window:
        columns, positions = torch.arange(keys), torch.arange(keys - rows, keys)
        mask = (columns[None, :] <= positions[:, None]) & (columns[None, :] > positions[:, None] - window)
        if groups > 1:
            key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask[None, None], scale=scaling)
    causal = None if rows == keys else torch.ones(rows, keys, dtype=torch.bool).tril(keys - rows)
    return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=causal, is_causal=causal is None,
                                                           scale=scaling, enable_gqa=groups > 1)


def use_rowwise_attention(model) -> None:
    """Make ``model`` (a transformers model) attend row by row: on specdec's attention op when its
    linears run on specdec's kernels, else one SDPA call a row. Registered here, not on import: the
    lean forward uses this module's functions without transformers' attention and masking code."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    name = NATIVE_ROWS if on_native_kernels(model) else SDPA_ROWS
    AttentionInterface.register(name, partial(rowwise_attention, kernels=native_kernels.bound()) if name == NATIVE_ROWS
                                else rowwise_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)  # long inputs go to sdpa with its own mask
    model.set_attn_implementation(name)


def on_native_kernels(model) -> bool:
    """Whether ``model``'s linears were put on specdec's kernels when it was loaded (quantize.Q8Linear)."""
    from .quantize import Q8Linear

    return any(isinstance(m, Q8Linear) for m in model.modules())
