"""The lean forward's decoder layer (lean_forward.py): a Llama layer as a flat function of precomputed
weights, and the attention every architecture's lean layer shares (lean_gemma.py).

Attention is the part a verify block must compute exactly as one-token forwards do: each answer's
rows attend alone (rowwise_attention.py), a prompt on an empty cache in one causal call. A layer
that slides a window (Mistral; Gemma 2 and 3's sliding layers) keeps every position in its cache
(decoding/kv.py): the window is in each row's seen keys (``window_seen``), as transformers' mask
puts it there, and in a prompt's mask, as transformers' SDPA call takes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import native_kernels
from .rowwise_attention import causal_rows, native_answers, row_keys, sdpa_rows, visible_keys


@dataclass(frozen=True)
class Rows:
    """One answer's rows in a forward: ``count`` of them, its cache, per row the keys it sees (a tree's
    gathered positions, or a window's; None: causal), whether they are a prompt, the window of the
    layers they are given to (None: they see every position), and of a prompt's rows how many come
    first and attend row by row (``head``: its positions below the op's rowwise limit, lean_forward.py),
    the rest in one causal call."""

    count: int
    cache: object
    seen: list | None = None
    prompt: bool = False
    window: int | None = None
    head: int = 0


def window_seen(rows: int, keys: int, window: int | None) -> list | None:
    """Per row of a causal block over a cache of every position, the keys a sliding window leaves it,
    as transformers' sliding mask gives them to rowwise attention: None (causal) while the mask is
    the causal one, which it is until the keys reach the window (transformers then builds the mask)."""
    if window is None or keys < window:
        return None
    columns = torch.arange(keys)
    positions = torch.arange(keys - rows, keys)
    mask = (columns[None, :] <= positions[:, None]) & (columns[None, :] > positions[:, None] - window)
    return visible_keys(mask[None, None], rows, keys)


class LeanDecoder:
    """Llama decoder layers as a flat function of precomputed weights (``layer_weights``)."""

    def __init__(self, config, native: bool = False):
        """``native``: attend on specdec's attention op (the model's linears are on its kernels)."""
        self.kernels = native_kernels.bound() if native else None
        self.cached_op = native  # answers' rows attend in the op that writes them into their caches (attend_cached)
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.groups = self.heads // self.kv_heads
        self.scaling = self.head_dim**-0.5

    @staticmethod
    def rotary_tables(rotary, x, positions) -> tuple[torch.Tensor, torch.Tensor]:
        """``rotary``'s cos and sin for [1, rows] ``positions`` as [rows, 1, head_dim], shared by the
        q and k heads, with the sign of rotate_half folded into sin's first half: rotate_half(q) · sin
        is cat(−q₂, q₁) · sin, which is roll(q) · cat(−sin₁, sin₂) exactly (a sign flip rounds the
        same either side of a product), for two ops a layer instead of four."""
        cos, sin = rotary(x, positions)
        half = sin.shape[-1] // 2
        return cos[0, :, None], torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)[0, :, None]

    def layer(self, x, weights, index, cos, sin, cache, seen, prompt: bool = False):
        """One decoder layer on [rows, hidden] float32; ``cos``/``sin``: [rows, 1, head_dim] from
        ``rotary_tables``; ``prompt``: the rows are a prompt on an empty cache (one causal attention call)."""
        return self.layer_rows(x, weights, index, cos, sin, (Rows(x.shape[0], cache, seen, prompt),))

    def layer_rows(self, x, weights, index, cos, sin, parts: tuple[Rows, ...] | list[Rows]):
        """One decoder layer on the rows of several answers, ``parts`` in order: every linear on all
        rows at once (the kernels compute each row alone), each part's attention on its own cache."""
        norm1, eps1, qkv, o_proj, norm2, eps2, gate_up, down, inner = weights
        rows = x.shape[0]
        h = norm1 * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps1))
        heads = qkv(h).view(rows, self.heads + 2 * self.kv_heads, self.head_dim)
        x = x + o_proj(self.attention(heads, cos, sin, index, parts).reshape(rows, -1))
        h = norm2 * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps2))
        both = gate_up(h)
        return x + down(torch.nn.functional.silu(both[:, :inner]) * both[:, inner:])

    def attention(self, heads, cos, sin, index, parts) -> torch.Tensor:
        """[rows, q + 2 kv heads, dim] projections (q and k normed where the architecture norms them)
        -> [rows, heads, dim]: q and k rotated, the cache updated, each part attending on its own."""
        q_and_k = self.heads + self.kv_heads
        qk = heads[:, :q_and_k]
        qk = qk * cos + qk.roll(self.head_dim // 2, -1) * sin
        layers = self.roomy_layers(parts, index)
        if layers is not None:
            return self.attend_cached(qk, heads[:, q_and_k:], layers, parts)
        prompts, rowwise, start = {}, [], 0
        for i, part in enumerate(parts):
            end = start + part.count
            query = qk[start:end, : self.heads].transpose(0, 1)[None]
            key = qk[start:end, self.heads :].transpose(0, 1)[None]
            value = heads[start:end, q_and_k:].transpose(0, 1)[None]
            if part.cache is not None:
                key, value = part.cache.update(key, value, index)
            if part.prompt:
                if part.head:  # its first rows as answers' rows are: each over its own causal keys
                    visible = key.shape[2] - part.count + part.head
                    rowwise.append((query[:, :, : part.head], key[:, :, :visible], value[:, :, :visible],
                                    part.seen and part.seen[: part.head]))
                prompts[i] = self.attend_prompt(query[:, :, part.head :], key, value, part.window)
            else:
                rowwise.append((query, key, value, part.seen))
            start = end
        attended = self.attend_answers(rowwise) if rowwise else None
        if prompts:  # a prompt joins the forward: the parts' rows put back in order
            counts = [p.head if p.prompt else p.count for p in parts]
            chunks = iter(attended.split([c for c in counts if c]) if rowwise else ())
            found = []
            for i, count in enumerate(counts):
                found += ([next(chunks)] if count else []) + ([prompts[i]] if i in prompts else [])
            attended = found[0] if len(found) == 1 else torch.cat(found)
        return attended

    def roomy_layers(self, parts, index: int) -> list | None:
        """Each part's cache layer ``index`` where the forward's rows can be written and attended in one
        call of specdec's op: answers' rows (no prompt) on caches that reserve room (reserved_cache.py,
        every cache the engine makes); else None, and each part is updated and attends as below."""
        if not self.cached_op:
            return None
        layers = []
        for part in parts:
            layer = None if part.prompt or part.cache is None else part.cache.layers[index]
            if getattr(layer, "planes", None) is None:
                return None
            layers.append(layer)
        return layers

    def attend_cached(self, qk, values, layers: list, parts) -> torch.Tensor:
        """What the parts' cache updates and ``attend_answers`` compute, in one call of specdec's op
        (attend_cached): in Python a part's slices, copies and views cost a batch more than its attention."""
        cached = [layer.make_room(part.count) for layer, part in zip(layers, parts)]
        counts, indices = [], []
        for part, length in zip(parts, cached):
            count, index = row_keys(part.seen, part.count, length + part.count)
            counts.append(count)
            indices.append(index)
        out = self.kernels.attend_cached(qk[:, : self.heads], qk[:, self.heads :], values, [layer.planes[0] for layer in layers],
                                         [layer.planes[1] for layer in layers], cached, counts, indices, self.scaling)
        for layer, part, length in zip(layers, parts, cached):
            layer.extend(length + part.count)
        return out

    def attend_answers(self, answers: list) -> torch.Tensor:
        """Per answer (query [1, heads, rows, dim], its key, value, seen) -> every answer's [rows, heads,
        dim] one after another, exactly as rowwise_attention computes each: on specdec's op all in one call."""
        if self.kernels is not None:
            return native_answers(self.kernels, answers, self.scaling)
        found = [sdpa_rows(query, key, value, self.scaling, self.groups, seen)[0] for query, key, value, seen in answers]
        return found[0] if len(found) == 1 else torch.cat(found)

    def attend_prompt(self, query, key, value, window: int | None = None):
        """[1, heads, rows, dim] -> [rows, heads, dim], the last ``rows`` of the keys' positions in one
        causal call (causal_rows): a prompt's rows past those that attend row by row, or a head's long
        catch-up after the positions it has cached."""
        return causal_rows(query, key, value, self.scaling, self.groups, window)[0].transpose(0, 1)
