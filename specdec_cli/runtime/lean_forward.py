"""A lean forward for Llama-architecture targets with weight-only int8/int4 linears, in the spirit of
gpt-fast's model.py: the same arithmetic as transformers' LlamaForCausalLM, op for op, without its
per-layer module and kwargs dispatch.

A one-token forward of a small quantised target spends most of its time outside the matmuls:
hundreds of aten calls and a tower of Python calls per layer (docs/notebook.md, "Where an int4 token
goes"). Here a layer is a flat loop over precomputed kernels and weights: RMSNorm, one fused q/k/v
matmul, rotary (cos/sin from the model's own rotary module once a forward, applied to q and k heads
in one go), the DynamicCache update, attention, o_proj, RMSNorm, fused gate/up, SiLU * up, down.
Every op is the one transformers runs on the same values (float32 activations, each linear cast to
bfloat16 and back), so logits are bit-identical to the transformers forward (tested), and a verify
block still scores exactly as one-token forwards (rowwise_attention.py).

It covers what the engine asks: batch of one, at most ``ROWWISE_UP_TO`` rows, a DynamicCache or
none, position ids, a 4D bool tree mask, ``logits_to_keep``, ``output_hidden_states`` (a flag, an
index or indices, as transformers selects them), and a prompt of any length on an empty cache (on
dense weights where given, dense_prefill.py: the one forward that is not transformers' arithmetic;
else on the kernels, its attention one causal call). Anything else — longer blocks on a cache,
other kwargs, batches — runs transformers' forward unchanged, and is counted (``fallbacks``,
``fallback_forwards``): the engine never asks for one, and a run that takes one says so.

A model loaded without transformers (lean_model.py) has no transformers forward to hand anything to
(it refuses), and its forwards give a ``LeanOutput`` and make specdec's own cache
(reserved_cache.py); a model of transformers' own gets transformers' output and cache, which its
generate reads. Which is chosen once, when the forward is installed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .dense_prefill import DENSE_FROM, lean_layer
from . import native_kernels
from .lean_model import LeanCausalLM
from .lean_weights import kernel, layer_weights, supported
from .reserved_cache import ReservedCache, appends
from .rowwise_attention import ROWWISE_UP_TO, native_answers, on_native_kernels, sdpa_rows, visible_keys, visible_keys_once

HANDLED = {"input_ids", "cache", "use_cache", "logits_to_keep", "attention_mask", "position_ids", "output_hidden_states"}


@dataclass(frozen=True)
class Rows:
    """One answer's rows in a forward: ``count`` of them, its cache, per row the keys it sees (a tree's
    gathered positions; None: causal), and whether they are a prompt on an empty cache."""

    count: int
    cache: object
    seen: list | None = None
    prompt: bool = False


class LeanDecoder:
    """Llama decoder layers as a flat function of precomputed weights (``layer_weights``)."""

    def __init__(self, config, native: bool = False):
        """``native``: attend on specdec's attention op (the model's linears are on its kernels)."""
        self.kernels = native_kernels.bound() if native else None
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
        rows, q_and_k = x.shape[0], self.heads + self.kv_heads
        h = norm1 * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps1))
        heads = qkv(h).view(rows, q_and_k + self.kv_heads, self.head_dim)
        qk = heads[:, :q_and_k]
        qk = qk * cos + qk.roll(self.head_dim // 2, -1) * sin
        prompts, rowwise, start = {}, [], 0
        for i, part in enumerate(parts):
            end = start + part.count
            query = qk[start:end, : self.heads].transpose(0, 1)[None]
            key = qk[start:end, self.heads :].transpose(0, 1)[None]
            value = heads[start:end, q_and_k:].transpose(0, 1)[None]
            if part.cache is not None:
                key, value = part.cache.update(key, value, index)
            if part.prompt:
                prompts[i] = self.attend_prompt(query, key, value)
            else:
                rowwise.append((query, key, value, part.seen))
            start = end
        attended = self.attend_answers(rowwise) if rowwise else None
        if prompts:  # a prompt joins the forward: the parts' rows put back in order
            chunks = iter(attended.split([p.count for p in parts if not p.prompt]) if rowwise else ())
            found = [prompts[i] if i in prompts else next(chunks) for i in range(len(parts))]
            attended = found[0] if len(found) == 1 else torch.cat(found)
        x = x + o_proj(attended.reshape(rows, -1))
        h = norm2 * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps2))
        both = gate_up(h)
        return x + down(torch.nn.functional.silu(both[:, :inner]) * both[:, inner:])

    def attend_answers(self, answers: list) -> torch.Tensor:
        """Per answer (query [1, heads, rows, dim], its key, value, seen) -> every answer's [rows, heads,
        dim] one after another, exactly as rowwise_attention computes each: on specdec's op all in one call."""
        if self.kernels is not None:
            return native_answers(self.kernels, answers, self.scaling)
        found = [sdpa_rows(query, key, value, self.scaling, self.groups, seen)[0] for query, key, value, seen in answers]
        return found[0] if len(found) == 1 else torch.cat(found)

    def attend_prompt(self, query, key, value):
        """[1, heads, rows, dim] -> [rows, heads, dim], every row in one causal call: a prompt on an
        empty cache, or a head's long catch-up after the positions it has cached (an explicit mask)."""
        rows, keys = query.shape[2], key.shape[2]
        causal = None if rows == keys else torch.ones(rows, keys, dtype=torch.bool).tril(keys - rows)
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=causal, is_causal=causal is None,
                                                               scale=self.scaling, enable_gqa=self.groups > 1)
        return out[0].transpose(0, 1)


@dataclass
class LeanOutput:
    """A forward's output for a model loaded without transformers: the fields the engine reads of
    transformers' CausalLMOutputWithPast."""

    logits: torch.Tensor
    cache: ReservedCache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None


def outputs_and_caches(model) -> tuple[type, object]:
    """The output type and the cache maker of ``model``'s forward: specdec's own for a model loaded
    without transformers, transformers' for one of its models (whose generate reads them)."""
    if isinstance(model, LeanCausalLM):
        return LeanOutput, lambda: ReservedCache(model.config.num_hidden_layers)
    from transformers.cache_utils import DynamicCache
    from transformers.modeling_outputs import CausalLMOutputWithPast

    return CausalLMOutputWithPast, lambda: DynamicCache(config=model.config)


class LeanLlama(LeanDecoder):
    """The precomputed pieces of one model's forward; ``forward`` is what the model's own becomes."""

    def __init__(self, model, dense: list[tuple[torch.Tensor, ...]] | None = None):
        """``dense``: dense (bfloat16 or float32) weights per layer for a prompt's forward (dense_prefill.py), or None."""
        config = model.config
        super().__init__(config, on_native_kernels(model))
        self.model, self.transformers_forward = model, model.forward
        self.output, self.new_cache = outputs_and_caches(model)
        self.fallbacks = 0  # forwards handed to transformers' forward (fallback_forwards)
        self.embed = model.model.embed_tokens.weight
        self.layers = [layer_weights(layer, config.intermediate_size) for layer in model.model.layers[: config.num_hidden_layers]]
        self.prompt_layers = None if dense is None else [lean_layer(w, d) for w, d in zip(self.layers, dense)]
        self.dense_from = None if dense is None else DENSE_FROM[dense[0][0].dtype]
        self.prompt_dtype = None if dense is None else dense[0][0].dtype  # computed_by.py reports it
        self.norm, self.norm_eps = model.model.norm.weight, model.model.norm.variance_epsilon
        self.head = kernel(model.lm_head)
        self.rotary = model.model.rotary_emb

    def forward(self, input_ids=None, **kwargs):
        rows = input_ids.shape[-1] if input_ids is not None else 0
        cache = kwargs.get("cache")
        if (input_ids is None or input_ids.shape[0] != 1 or rows == 0 or not HANDLED.issuperset(kwargs)
                or self.model.training or not (cache is None or appends(cache))
                or self.embed.dtype != torch.float32 or isinstance(kwargs.get("logits_to_keep", 0), torch.Tensor)):
            return self.fallback(input_ids, **kwargs)
        mask = kwargs.get("attention_mask")
        if mask is not None and (mask.dim() != 4 or mask.dtype != torch.bool):
            return self.fallback(input_ids, **kwargs)
        past = cache.get_seq_length() if cache is not None else 0
        to_keep = kwargs.get("logits_to_keep", 0)
        prompt = self.is_prompt(rows, past, mask, to_keep)
        if rows > ROWWISE_UP_TO and not prompt:
            return self.fallback(input_ids, **kwargs)
        use_cache = kwargs.get("use_cache")
        if cache is None and (self.model.config.use_cache if use_cache is None else use_cache):
            cache = self.new_cache()  # as transformers: a given cache is updated either way
        positions = kwargs.get("position_ids")
        if positions is None:
            positions = torch.arange(past, past + rows)
        positions = positions.reshape(-1)
        keep = self.hidden_state_indices(kwargs.get("output_hidden_states"))
        hidden, states = self.layers_forward(input_ids[0], positions, cache, mask, keep, prompt)
        logits = self.head(hidden if not to_keep else hidden[-to_keep:])
        return self.output(logits=logits[None], cache=cache, hidden_states=None if states is None else tuple(states))

    def fallback(self, input_ids, **kwargs):
        """transformers' forward, for what the lean one does not run; counted."""
        self.fallbacks += 1
        return self.transformers_forward(input_ids, **kwargs)

    def hidden_state_indices(self, selection) -> set[int] | None:
        """transformers' selection: True = all, an index or indices (negative from the end) = those."""
        count = len(self.layers) + 1
        if selection is None or selection is False:
            return None
        if selection is True:
            return set(range(count))
        chosen = [selection] if isinstance(selection, int) else list(selection)
        return {i % count for i in chosen if -count <= i < count}

    def layers_forward(self, ids, positions, cache, mask, keep, prompt: bool = False):
        rows = ids.shape[0]
        keys = rows + (cache.get_seq_length() if cache is not None else 0)
        seen = visible_keys_once(mask, rows, keys) if mask is not None else None
        dense = prompt and self.prompt_layers is not None
        return self.parts_forward(ids, [positions], [Rows(rows, cache, seen, prompt)], keep, dense)

    def parts_forward(self, ids, positions: list, parts: list[Rows], keep, dense: bool = False):
        """The decoder over the rows of ``parts`` (``ids`` theirs in order, ``positions`` each part's);
        ``dense``: one prompt, on the dense copies (dense_prefill.py)."""
        x = self.embed[ids]  # [rows, hidden] float32
        states = None if keep is None else [None] * (len(self.layers) + 1)
        if states is not None and 0 in keep:
            states[0] = x[None]
        # The model's own rotary module, once a forward a part, on that part's [1, rows] positions: a
        # table, or the parts' positions in one call, would round cos/sin differently where a short
        # vector takes the scalar tail loop.
        tables = [self.rotary_tables(self.rotary, x, p[None]) for p in positions]
        cos, sin = tables[0] if len(tables) == 1 else (torch.cat([c for c, _ in tables]), torch.cat([s for _, s in tables]))
        for index, weights in enumerate(self.prompt_layers if dense else self.layers):
            x = self.layer_rows(x, weights, index, cos, sin, parts)
            if states is not None and index + 1 in keep:
                states[index + 1] = x[None]
        x = self.norm * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.norm_eps))
        if states is not None and states[-1] is not None:
            states[-1] = x[None]  # transformers' last hidden state is the normed one
        return x, states

    def is_prompt(self, rows: int, past: int, mask, to_keep) -> bool:
        """Whether a forward is a prompt's: an empty cache, and only its last row's logits wanted (a
        verify block scores every row): on the dense copies from dense_from rows; without them, past a
        block's rows, on the kernels in one causal call."""
        return past == 0 and mask is None and to_keep == 1 and (
            rows >= self.dense_from if self.prompt_layers is not None else rows > ROWWISE_UP_TO)

    @property
    def batches_prompts(self) -> bool:
        """Whether a prompt may share a forward with other answers' rows: not on the dense copies,
        whose matmuls round by the rows they are given."""
        return self.prompt_layers is None

    def forward_many(self, blocks: list[Block], output_hidden_states=None) -> list:
        """Several answers' blocks in one forward, each on its own cache: every row is computed as
        that answer's own forward computes it (the linears' kernels work row by row, each block's
        attention and rotary tables are its own), so a batched answer is token for token its own."""
        parts, positions = [], []
        for block in blocks:
            rows, past = block.ids.shape[0], block.cache.get_seq_length()
            prompt = self.is_prompt(rows, past, block.mask, block.keep)
            if not appends(block.cache) or (prompt and not self.batches_prompts) or (rows > ROWWISE_UP_TO and not prompt):
                raise ValueError(f"a block of {rows} rows over {past} cached positions cannot share a forward")
            seen = visible_keys(block.mask, rows, rows + past) if block.mask is not None else None
            parts.append(Rows(rows, block.cache, seen, prompt))
            positions.append(torch.arange(past, past + rows) if block.positions is None else block.positions.reshape(-1))
        keep = self.hidden_state_indices(output_hidden_states)
        hidden, states = self.parts_forward(torch.cat([b.ids for b in blocks]), positions, parts, keep)
        spans, start = [], 0
        for part in parts:
            spans.append((start, start + part.count))
            start += part.count
        kept = [(a if not b.keep else e - b.keep, e) for (a, e), b in zip(spans, blocks)]
        logits = self.head(torch.cat([hidden[a:e] for a, e in kept]))
        outputs, at = [], 0
        for (a, e), (ka, ke), block in zip(spans, kept, blocks):
            own = None if states is None else tuple(None if s is None else s[:, a:e] for s in states)
            outputs.append(self.output(logits=logits[None, at : at + ke - ka], cache=block.cache, hidden_states=own))
            at += ke - ka
        return outputs


@dataclass(frozen=True)
class Block:
    """One answer's part of a forward of several (``LeanLlama.forward_many``): its token ids (1-D),
    its cache, positions (None: after the cached ones), a 4D bool mask (a tree's; None: causal), and
    how many of its last rows' logits it wants (0: all)."""

    ids: torch.Tensor
    cache: object
    positions: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    keep: int = 0


def forward_many(model):
    """``model``'s forward of several answers' blocks (``LeanLlama.forward_many``), or None where its
    lean forward is not installed."""
    lean = getattr(model.forward, "__self__", None)
    return lean if isinstance(lean, LeanLlama) else None


def use_lean_forward(model, dense: list[tuple[torch.Tensor, ...]] | None = None) -> bool:
    """Install the lean forward on ``model`` when it is supported, with dense weights for
    prompts where given (dense_prefill.py); True when it was installed."""
    if not supported(model):
        return False
    model.forward = LeanLlama(model, dense).forward
    return True


def fallback_forwards(model) -> int:
    """How many of ``model``'s forwards its lean forward handed to transformers' (0 without one)."""
    lean = getattr(model.forward, "__self__", None)
    return lean.fallbacks if isinstance(lean, LeanLlama) else 0
