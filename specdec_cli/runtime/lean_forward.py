"""A lean forward for targets with weight-only int8/int4 linears, in the spirit of gpt-fast's
model.py: the same arithmetic as transformers' LlamaForCausalLM, op for op, without its per-layer
module and kwargs dispatch. Mistral, Qwen 2 and 3 and Phi-3 are Llama's layer with a window, biases,
q/k norms or checkpoint-fused projections (lean_weights.py); Gemma 2 and 3 have layers of their own
(lean_gemma.py). Layers that slide a window keep every position in the cache and see the window
through their rows' seen keys (lean_decoder.py); each kind of layer has its own rotary tables.

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

from .block_embedding import embedding_dtype, embedding_rows
from .dense_prefill import DENSE_FROM, lean_layer
from .lean_decoder import LeanDecoder, Rows, window_seen
from .lean_model import LeanCausalLM
from .lean_weights import kernel, layer_kinds, layer_weights, plain_norm, rms_norm
from .reserved_cache import ReservedCache, appends
from .rowwise_attention import NATIVE_ROWWISE_UP_TO, ROWWISE_UP_TO, on_native_kernels, visible_keys

HANDLED = {"input_ids", "cache", "use_cache", "logits_to_keep", "attention_mask", "position_ids", "output_hidden_states"}


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


def keeps_every_position(cache) -> bool:
    """A cache the lean forward may write to (reserved_cache.appends) whose layers keep every position:
    transformers' sliding layers (in the DynamicCache its generate makes) drop what leaves the window,
    and the lean forward reads a layer's keys as positions 0, 1, … (decoding/kv.py's caches keep them)."""
    return appends(cache) and not any(getattr(layer, "is_sliding", False) for layer in getattr(cache, "layers", ()))


class LeanLlama(LeanDecoder):
    """The precomputed pieces of one model's forward; ``forward`` is what the model's own becomes.
    Llama, and the architectures that are Llama's layer with q/k/v biases (Qwen 2), q/k norms
    (Qwen 3) or a sliding window (Mistral): what differs is in the weights (lean_weights.py) and in
    each kind of layer's window and rotary tables; Gemma's layers are lean_gemma.py's."""

    def __init__(self, model, dense: list[tuple[torch.Tensor, ...]] | None = None):
        """``dense``: dense (bfloat16 or float32) weights per layer for a prompt's forward (dense_prefill.py), or None."""
        config = model.config
        super().__init__(config, on_native_kernels(model))
        self.model, self.transformers_forward = model, model.forward
        self.output, self.new_cache = outputs_and_caches(model)
        self.fallbacks = 0  # forwards handed to transformers' forward (fallback_forwards)
        self.embed_rows = embedding_rows(model.model.embed_tokens)  # the float table's, or a GGUF block table's
        self.embed_dtype = embedding_dtype(model.model.embed_tokens)
        self.layers = [self.weights_of(layer, config) for layer in model.model.layers[: config.num_hidden_layers]]
        self.prompt_layers = None if dense is None else [lean_layer(w, d) for w, d in zip(self.layers, dense)]
        self.dense_from = None if dense is None else DENSE_FROM[dense[0][0].dtype]
        self.prompt_dtype = None if dense is None else dense[0][0].dtype  # computed_by.py reports it
        self.final = self.norm_of(model.model.norm)
        self.head = kernel(model.lm_head)
        self.rotary = model.model.rotary_emb
        self.kinds, self.windows = layer_kinds(config)  # per layer its kind; per kind its window

    @staticmethod
    def weights_of(layer, config) -> tuple:
        return layer_weights(layer, config.intermediate_size)

    norm_of = staticmethod(plain_norm)  # a norm's weights as final_norm takes them

    def kind_rotary(self, kind: str):
        """The rotary module's (x, positions) -> cos, sin for a kind of layer: the one module for all."""
        return self.rotary

    def embedded(self, ids) -> torch.Tensor:
        return self.embed_rows(ids)  # [rows, hidden] float32

    def final_norm(self, x) -> torch.Tensor:
        return rms_norm(x, *self.final)

    def logits(self, hidden) -> torch.Tensor:
        return self.head(hidden)

    def forward(self, input_ids=None, **kwargs):
        rows = input_ids.shape[-1] if input_ids is not None else 0
        cache = kwargs.get("cache")
        if (input_ids is None or input_ids.shape[0] != 1 or rows == 0 or not HANDLED.issuperset(kwargs)
                or self.model.training or not (cache is None or keeps_every_position(cache))
                or self.embed_dtype != torch.float32 or isinstance(kwargs.get("logits_to_keep", 0), torch.Tensor)):
            return self.fallback(input_ids, **kwargs)
        mask = kwargs.get("attention_mask")
        if mask is not None and not self.takes_mask(mask):
            return self.fallback(input_ids, **kwargs)
        past = cache.get_seq_length() if cache is not None else 0
        to_keep = kwargs.get("logits_to_keep", 0)
        prompt = self.is_prompt(rows, past, mask, to_keep)
        if rows > self.rowwise_up_to and not prompt:
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
        logits = self.logits(hidden if not to_keep else hidden[-to_keep:])
        return self.output(logits=logits[None], cache=cache, hidden_states=None if states is None else tuple(states))

    def takes_mask(self, mask) -> bool:
        """A 4D bool mask for every layer, or one per kind of layer (transformers' mapping by layer type)."""
        if isinstance(mask, dict):
            return all(self.takes_mask(mask.get(kind)) for kind in self.windows)
        return isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.dtype == torch.bool

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

    def kind_rows(self, rows: int, cache, mask, prompt: bool) -> dict[str, Rows]:
        """An answer's rows as each kind of layer sees them: under its mask (one for all layers, or
        one per kind), else causally, within the kind's window where it slides one."""
        past = cache.get_seq_length() if cache is not None else 0
        keys = rows + past
        head = max(0, self.rowwise_up_to - past) if prompt and self.shares_prefixes else 0
        found = {}
        for kind, window in self.windows.items():
            own = mask.get(kind) if isinstance(mask, dict) else mask
            seen = window_seen(rows, keys, window) if own is None else visible_keys(own, rows, keys)
            found[kind] = Rows(rows, cache, seen, prompt, window, head)
        return found

    def layers_forward(self, ids, positions, cache, mask, keep, prompt: bool = False):
        dense = prompt and self.prompt_layers is not None
        return self.parts_forward(ids, [positions], [self.kind_rows(ids.shape[0], cache, mask, prompt)], keep, dense)

    def parts_forward(self, ids, positions: list, parts: list[dict[str, Rows]], keep, dense: bool = False):
        """The decoder over the rows of ``parts`` (``ids`` theirs in order, ``positions`` each part's,
        each part as every kind of layer sees it); ``dense``: one prompt, on the dense copies (dense_prefill.py)."""
        x = self.embedded(ids)
        states = None if keep is None else [None] * (len(self.layers) + 1)
        if states is not None and 0 in keep:
            states[0] = x[None]
        # The model's own rotary module, once a forward a part, on that part's [1, rows] positions: a
        # table, or the parts' positions in one call, would round cos/sin differently where a short
        # vector takes the scalar tail loop.
        tables = {}
        for kind in set(self.kinds):
            found = [self.rotary_tables(self.kind_rotary(kind), x, p[None]) for p in positions]
            tables[kind] = found[0] if len(found) == 1 else (torch.cat([c for c, _ in found]), torch.cat([s for _, s in found]))
        by_kind = {kind: [part[kind] for part in parts] for kind in self.windows}
        for index, weights in enumerate(self.prompt_layers if dense else self.layers):
            kind = self.kinds[index]
            x = self.layer_rows(x, weights, index, *tables[kind], by_kind[kind])
            if states is not None and index + 1 in keep:
                states[index + 1] = x[None]
        x = self.final_norm(x)
        if states is not None and states[-1] is not None:
            states[-1] = x[None]  # transformers' last hidden state is the normed one
        return x, states

    def is_prompt(self, rows: int, past: int, mask, to_keep) -> bool:
        """Whether a forward is a prompt's: causal, only its last row's logits wanted (a verify block
        scores every row), and rows that answers' rows may not have. On the dense copies, an empty
        cache from dense_from rows. On specdec's attention op, rows past position ``rowwise_up_to``,
        on a cache that ends below it: the positions below it attend row by row (``Rows.head``) and
        the rest in one causal call, so a prompt's first ``rowwise_up_to`` positions are what any
        forward computes there (batched prompts copy a shared prefix's: decoding/shared_prefix.py).
        On torch's kernels, an empty cache past ``ROWWISE_UP_TO`` rows, in one causal call."""
        if mask is not None or to_keep != 1:
            return False
        if self.prompt_layers is not None:
            return past == 0 and rows >= self.dense_from
        if self.cached_op:
            return past < self.rowwise_up_to < past + rows
        return past == 0 and rows > ROWWISE_UP_TO

    @property
    def rowwise_up_to(self) -> int:
        """The most rows a block attends row by row: on specdec's op a prompt's first positions too."""
        return NATIVE_ROWWISE_UP_TO if self.cached_op else ROWWISE_UP_TO

    @property
    def prefix_up_to(self) -> int:
        """The most prompt positions a batch may copy from another answer's cache (``shares_prefixes``):
        those below ``rowwise_up_to`` but the last, so that the joining prompt's forward still holds a
        row below it and is a prompt's (``is_prompt``), its rows from ``rowwise_up_to`` on attending in
        one causal call as in its own forward; as answers' rows they would round otherwise."""
        return self.rowwise_up_to - 1

    @property
    def shares_prefixes(self) -> bool:
        """Whether a prompt's first ``rowwise_up_to`` positions are what any forward computes there, so
        that a batch may copy them from one answer's cache to another's (decoding/shared_prefix.py):
        on specdec's attention op, prompts on the kernels."""
        return self.cached_op and self.prompt_layers is None

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
            if not keeps_every_position(block.cache) or (prompt and not self.batches_prompts) or (rows > self.rowwise_up_to and not prompt):
                raise ValueError(f"a block of {rows} rows over {past} cached positions cannot share a forward")
            parts.append(self.kind_rows(rows, block.cache, block.mask, prompt))
            positions.append(torch.arange(past, past + rows) if block.positions is None else block.positions.reshape(-1))
        keep = self.hidden_state_indices(output_hidden_states)
        hidden, states = self.parts_forward(torch.cat([b.ids for b in blocks]), positions, parts, keep)
        spans, start = [], 0
        for block in blocks:
            spans.append((start, start + block.ids.shape[0]))
            start += block.ids.shape[0]
        kept = [(a if not b.keep else e - b.keep, e) for (a, e), b in zip(spans, blocks)]
        logits = self.logits(torch.cat([hidden[a:e] for a, e in kept]))
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


def fallback_forwards(model) -> int:
    """How many of ``model``'s forwards its lean forward handed to transformers' (0 without one)."""
    lean = getattr(model.forward, "__self__", None)
    return lean.fallbacks if isinstance(lean, LeanLlama) else 0
