"""A feature-level draft head (EAGLE-style) and the drafter that runs it.

The head reads what the target already computed: at position t its input is the embedding of token
t concatenated with the target's last hidden state (post-norm) at t − 1; a linear layer folds the
two into one vector, one Llama decoder layer with its own small KV cache refines it into a guess of
the target's hidden state at t, and the target's own (frozen) lm_head turns that into logits. To
draft K tokens it feeds its own guesses back in place of the target's states. Only the fc and the
decoder layer are trained and saved (a few MB); embedding and lm_head are borrowed from the target,
which is why a head is tied to the one target it was trained for.

A fused head (meta ``format`` 2, EAGLE-3) reads several of the target's hidden states instead of the
last one: ``feature_layers`` indexes transformers' ``hidden_states`` (-1 is the last, post-norm),
and a linear ``fuse`` folds their concatenation to one H-wide feature for the confirmed positions;
the positions it drafts feed back its own H-wide guess in place of that. A head without
``feature_layers`` in its meta (format 1) reads the last hidden state alone.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from ..errors import UserError
from ..limits import MAX_K
from ..runtime.lean_forward import LeanDecoder, layer_supported, layer_weights
from ..pairs.meta import META_FILE, read_meta, write_meta  # noqa: F401 (read_meta: the tests' way in)
from ..runtime.quantize import QUANTISED, native_linear, output_weight, quantise_model, quantised_weight
from ..runtime.reserved_cache import appends
from ..runtime.rowwise_attention import ROWWISE_UP_TO, on_native_kernels, visible_keys
from .drafters import Composite, Draft, Drafter, autoregress, common_prefix
from .head_files import WEIGHTS_FILE, build_head, read_head
from .head_layer import default_rotary, layer_config, layer_skeleton
from .control.gate import DraftGate
from .kv import crop_cache, reserved_cache
from .tree import TreeShape, best_nodes, path_to

FORMAT = 2  # meta "format": 1 (absent) = the last hidden state only; 2 adds "feature_layers"
TOP_ONLY = (-1,)

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class DraftHead(nn.Module):
    def __init__(self, layer: dict, feature_layers: tuple[int, ...] = TOP_ONLY, skeleton: bool = False):
        """``layer``: LlamaConfig fields of the decoder layer (see ``head_config``), saved with the weights;
        ``feature_layers``: the target's hidden states it reads (indices into ``hidden_states``);
        ``skeleton``: the layer's parameters without transformers' classes, on the meta device until
        weights are assigned (head_layer.py), for a head loaded to draft quantised."""
        super().__init__()
        self.config_dict = dict(layer)
        self.feature_layers = tuple(int(i) for i in feature_layers)
        if skeleton:
            config = layer_config(layer)
        else:
            from transformers import LlamaConfig

            config = LlamaConfig(**layer)
            config._attn_implementation = "sdpa"
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(2 * hidden, hidden)
        width = len(self.feature_layers) * hidden
        self.fuse = nn.Linear(width, hidden, bias=False) if len(self.feature_layers) > 1 else None
        if skeleton:
            self.layer, self.rotary = layer_skeleton(config), default_rotary(config)
        else:
            from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

            self.layer = LlamaDecoderLayer(config, layer_idx=0)
            self.rotary = LlamaRotaryEmbedding(config)
        self.skeleton = skeleton
        self.lean: tuple | None = None

    def go_lean(self, native: bool = False) -> None:
        """Once quantised (fused q/k/v and gate/up): run the decoder layer as lean_forward's flat
        function, without transformers' per-call dispatch, which is most of a chain step; ``native``:
        its attention on specdec's op, as its linears. A skeleton has no other layer to run: one the
        lean layer cannot run is refused here, at load time."""
        if layer_supported(self.layer):
            self.lean = (LeanDecoder(self.config, native), layer_weights(self.layer, self.config.intermediate_size))
        elif self.skeleton:
            raise ValueError("the draft head's layer is not a fused, quantised Llama layer without biases")

    def fused(self, features: torch.Tensor) -> torch.Tensor:
        """The target's (concatenated) hidden states → the H-wide feature the head reads."""
        return features if self.fuse is None else self.fuse(features)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, cache=None, start: int = 0,
                positions: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """(batch, positions, H) embeddings and previous-position H-wide features (``fused`` target
        states, or the head's own guesses) → guessed features.

        Consecutive positions from ``start`` under a causal mask; or, for a tree level, the given
        ``positions`` (1, n) and 4D bool ``mask`` (decoding/tree.py's layout).
        """
        x = self.fc(torch.cat([embeds, features], dim=-1))
        if positions is None:
            positions = torch.arange(start, start + x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        if self.lean is not None:
            return self.lean_forward(x, positions, cache, mask)
        from transformers.masking_utils import create_causal_mask

        if mask is None:
            mask = create_causal_mask(config=self.config, inputs_embeds=x, attention_mask=None, cache=cache,
                                      position_ids=positions)
        return self.layer(x, attention_mask=mask, position_ids=positions, cache=cache, use_cache=cache is not None,
                          position_embeddings=self.rotary(x, positions))

    def lean_forward(self, x: torch.Tensor, positions: torch.Tensor, cache, mask: torch.Tensor | None) -> torch.Tensor:
        """The quantised layer on every block a drafter gives it, so that nothing is built or imported
        mid-decode: each row attends alone (rowwise_attention.py), a tree level's rows to their
        ancestors, and a catch-up longer than ``ROWWISE_UP_TO`` rows (after a long prompt, or after
        rounds the head sat out) in one causal call, as transformers' layer ran it."""
        if x.shape[0] != 1 or not appends(cache):
            raise ValueError("a quantised draft head drafts one sequence at a time, on a cache that appends "
                             "(kv.reserved_cache)")
        decoder, weights = self.lean
        rows, past = x.shape[1], cache.get_seq_length()
        seen = None if mask is None else visible_keys(mask, rows, past + rows)
        prompt = mask is None and rows > ROWWISE_UP_TO
        cos, sin = decoder.rotary_tables(self.rotary, x, positions)
        return decoder.layer(x[0], weights, 0, cos, sin, cache, seen, prompt)[None]


def head_config(target: PreTrainedModel) -> dict:
    """The decoder layer's shape, taken from the target's so that its features fit (saved as JSON)."""
    c = target.config.get_text_config()
    hidden = c.hidden_size
    heads = getattr(c, "num_attention_heads", None) or max(1, hidden // 64)
    rope = getattr(c, "rope_parameters", None)
    if not (isinstance(rope, dict) and "rope_type" in rope):
        rope = {"rope_type": "default", "rope_theta": float(getattr(c, "rope_theta", 10000.0))}
    return {
        "vocab_size": c.vocab_size, "hidden_size": hidden, "num_hidden_layers": 1,
        "intermediate_size": getattr(c, "intermediate_size", None) or 4 * hidden,
        "num_attention_heads": heads, "num_key_value_heads": getattr(c, "num_key_value_heads", None) or heads,
        "head_dim": getattr(c, "head_dim", None) or hidden // heads, "rms_norm_eps": getattr(c, "rms_norm_eps", 1e-6),
        "max_position_embeddings": getattr(c, "max_position_embeddings", 4096), "rope_parameters": dict(rope),
    }


def target_identity(model: PreTrainedModel, source) -> dict:
    """The target a head belongs to: its source, and a hash of its shape and lm_head weight.

    The weight is hashed in bfloat16 so that the same target loaded in float32 or bfloat16 matches.
    """
    c = model.config.get_text_config()
    shape = {k: getattr(c, k, None) for k in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers")}
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode())
    weight = output_weight(model).detach().to("cpu", torch.bfloat16).contiguous()
    digest.update(weight.view(torch.int16).numpy().tobytes())
    return {"source": str(source), "fingerprint": digest.hexdigest()[:16]}


def save_head(directory: str | Path, head: DraftHead, meta: dict) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in head.state_dict().items()}, directory / WEIGHTS_FILE)
    write_meta(directory, {**meta, "kind": "head", "format": FORMAT, "feature_layers": list(head.feature_layers)})


def check_target(meta: dict, directory, target: PreTrainedModel, source) -> None:
    """Refuse a head trained for another target: its features would mean nothing to it."""
    mine = target_identity(target, source)
    theirs = meta.get("target", {})
    if theirs.get("fingerprint") != mine["fingerprint"]:
        raise UserError(
            f"draft head {directory} was trained for target {theirs.get('source')} (fingerprint "
            f"{theirs.get('fingerprint')}), not for {mine['source']} (fingerprint {mine['fingerprint']}); "
            "train one for this target with `specdec train-draft --kind head`"
        )


def load_head(directory: str | Path, target: PreTrainedModel, source, precision: str = "float32") -> "HeadDrafter":
    """The head saved in ``directory``, refused unless it was trained for this very target;
    ``precision``: the target's dtype, which the head follows (see HeadDrafter)."""
    meta, state = read_head(Path(directory))
    check_target(meta, directory, target, source)
    if meta.get("format", 1) > FORMAT:
        raise UserError(f"draft head {directory} has format {meta['format']}, newer than this specdec reads ({FORMAT}); upgrade specdec")
    quantised = precision in QUANTISED  # drafts with the lean forward: no transformers layer unless asked for
    head = build_head(meta, state, directory, skeleton=quantised)
    top = meta.get("top_vocab")
    return HeadDrafter(head, target, None if top is None else torch.tensor(top, dtype=torch.long), precision)


def head_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The target's lm_head applied to (guessed) features; ``weight`` may hold only the allowed rows."""
    return F.linear(hidden, weight.to(hidden.dtype))


class HeadDrafter(Drafter):
    """Drafts with a DraftHead on the target's features, which the engine hands over as tokens are confirmed.

    The head's KV cache keeps only positions computed from the target's true features; the
    positions it drafted on its own guesses are cropped away each round, and the newly confirmed
    ones enter with the target's features in the same forward that starts the next draft.

    A head whose target runs weight-only int8 or int4 (``precision``) runs int8: its linears and
    output rows on the target's kernels (specdec's where the target's are), fused like the target's
    (runtime/quantize.py), its layer through the lean path. Between two target forwards its weights leave the CPU's caches, so a
    draft is paid in bytes: int8 made the shipped head's rounds 1.6x cheaper than float32 at the
    same acceptance; int4 saved another 17 % of draft time but cost 0.02 of α, a wash. Only the
    drafts change, never what the target accepts.
    """

    name = "head"
    uses_target_features = True

    def __init__(self, head: DraftHead, target: PreTrainedModel, allowed: torch.Tensor | None = None,
                 precision: str = "float32"):
        weight = output_weight(target)  # float even when the target's own lm_head is quantised
        self.device = weight.device
        self.precision = "int8" if precision in QUANTISED else "float32"
        self.head = head.to(self.device).eval()
        native = self.precision in QUANTISED and on_native_kernels(target)
        if self.precision in QUANTISED:  # a copy: the float head may be shared (training, tests)
            self.head = quantise_model(copy.deepcopy(self.head), self.precision, native=native)
            self.head.go_lean(native)
        self.feature_layers = head.feature_layers
        self.embed = target.get_input_embeddings()
        self.vocab_size = target.config.get_text_config().vocab_size
        self.allowed = None if allowed is None else allowed.to(self.device)
        rows = (weight[: self.vocab_size] if allowed is None else weight[self.allowed]).detach().float()
        self._score = (native_linear(rows, self.precision) if native
                       else quantised_weight(rows, self.precision) if self.precision in QUANTISED
                       else lambda hidden: head_logits(hidden, rows))
        self.reset()

    def reset(self) -> None:
        self.cache = reserved_cache(self.head.config)
        self.cached_tokens = torch.empty(0, dtype=torch.long)
        self.true_length = 0  # head cache positions computed from the target's own features
        # Row t + 1 holds the target's feature at position t; row 0 stays zero (what the first token
        # reads). Grown by doubling, so handing over a round's rows costs those rows, not the context:
        # the engine hands them every round, speculating or not.
        self._rows = torch.zeros(256, len(self.feature_layers) * self.head.config.hidden_size, device=self.device)
        self._count = 1

    @property
    def features(self) -> torch.Tensor:
        """The target's features handed over so far, one row per confirmed position."""
        return self._rows[1 : self._count]

    def add_features(self, rows: torch.Tensor) -> None:
        end = self._count + rows.shape[0]
        if end > self._rows.shape[0]:
            grown = self._rows.new_zeros(max(end, 2 * self._rows.shape[0]), self._rows.shape[1])
            grown[: self._count] = self._rows[: self._count]
            self._rows = grown
        self._rows[self._count : end] = rows.detach().to(self.device, torch.float32)
        self._count = end

    def _catch_up(self, context: torch.Tensor) -> tuple[torch.Tensor, float]:
        """Crop the cache to the positions computed from true features, feed the newly confirmed ones,
        and return the guess at the last context token (whose logits draft the first token) and the
        seconds spent catching up after rounds without the head (0 for an ordinary round)."""
        n = context.shape[0]
        if self._count - 1 != n - 1:
            raise RuntimeError(f"head drafter holds {self._count - 1} target features for {n} tokens; "
                               "it must be driven by the engine, which hands them over")
        keep = min(self.true_length, common_prefix(self.cached_tokens, context), n - 1)
        crop_cache(self.cache, keep)
        # Position t reads token t and the target's feature at t - 1 (zeros before the first token):
        # only the positions since the last draft run (a catch-up after rounds without speculation).
        previous = self._rows[keep:n]
        started = time.perf_counter()
        guess = self._step(context[keep:n], previous, keep)
        caught_up = time.perf_counter() - started if n - keep > MAX_K + 1 else 0.0
        self.true_length = n
        return guess, caught_up

    @torch.inference_mode()
    def propose(self, context, k, sampling, noise, gate: DraftGate | None = None) -> Draft:
        n = context.shape[0]
        if k <= 0:
            return Draft.empty()
        guess, caught_up = self._catch_up(context)
        position = [n]

        def step(token):
            nonlocal guess
            guess = self._step(token.view(1), guess.view(1, -1), position[0], fuse=False)
            position[0] += 1
            return self._logits(guess)

        draft = autoregress(self._logits(guess), step, k, sampling, noise, start=n, gate=gate)
        draft.source, draft.catchup_s = self.name, caught_up
        self.cached_tokens = torch.cat([context, draft.tokens[:-1]])
        return draft

    @torch.inference_mode()
    def propose_tree(self, context: torch.Tensor, shape: TreeShape) -> Draft:
        """A tree of at most ``shape.nodes`` nodes, EAGLE-2 style.

        Level by level, the ``width`` best new nodes by cumulative draft log-probability are
        expanded in one head forward (each sees the true cache and its own ancestors), each giving
        its top-``width`` children; then the best ``nodes`` of all candidates are kept. Expansion
        stops early once no deeper node could make the cut (a child never scores above its parent).
        The candidates are deterministic: each is kept with the chance the target gives it.
        """
        n = context.shape[0]
        if shape.nodes <= 0:
            return Draft.empty()
        root_guess, caught_up = self._catch_up(context)
        self.cached_tokens = context.clone()  # what lies past the true positions is tree-shaped: cropped next round
        width = max(1, min(shape.width, shape.nodes))
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        slot: dict[int, int] = {}  # candidate → its head cache position, once expanded
        guesses: dict[int, torch.Tensor] = {}

        def add_children(parent: int, logits: torch.Tensor, base: float) -> list[int]:
            top = torch.log_softmax(logits, dim=-1).topk(width)
            new = []
            for value, token in zip(top.values.tolist(), top.indices.tolist()):
                new.append(len(tokens))
                tokens.append(token), parents.append(parent), scores.append(base + value)
            return new

        frontier = add_children(-1, self._logits(root_guess), 0.0)
        for level in range(1, shape.depth):
            frontier = sorted(frontier, key=lambda i: (-scores[i], i))[:width]
            frontier = [i for i in frontier if scores[i] > float("-inf")]
            if not frontier:
                break
            if len(scores) >= shape.nodes and sorted(scores, reverse=True)[shape.nodes - 1] >= scores[frontier[0]]:
                break  # every deeper node would score below the nodes already chosen
            cached = self.cache.get_seq_length()
            mask = torch.zeros(len(frontier), cached + len(frontier), dtype=torch.bool)
            mask[:, :n] = True
            for row, node in enumerate(frontier):  # each node sees the context, its ancestors and itself
                mask[row, cached + row] = True
                mask[row, [slot[a] for a in path_to(parents, parents[node])]] = True
            features = torch.stack([root_guess if parents[i] < 0 else guesses[parents[i]] for i in frontier])
            embeds = self.embed(torch.tensor([tokens[i] for i in frontier]).to(self.embed.weight.device))
            positions = torch.full((1, len(frontier)), n - 1 + level, device=self.device)
            out = self.head(embeds.to(self.device, torch.float32)[None], features[None], self.cache,
                            positions=positions, mask=mask[None, None].to(self.device))[0]
            logits = self._logits(out)
            next_frontier = []
            for row, node in enumerate(frontier):
                slot[node], guesses[node] = cached + row, out[row]
                next_frontier += add_children(node, logits[row], scores[node])
            frontier = next_frontier

        chosen = best_nodes(scores, parents, shape.nodes)
        block = {candidate: i + 1 for i, candidate in enumerate(chosen)}  # block index; the root is 0
        return Draft(torch.tensor([tokens[i] for i in chosen], dtype=torch.long),
                     parents=tuple(0 if parents[i] < 0 else block[parents[i]] for i in chosen),
                     source=self.name, catchup_s=caught_up)

    def _step(self, tokens: torch.Tensor, features: torch.Tensor, start: int, fuse: bool = True) -> torch.Tensor:
        """Feed positions from ``start``: the target's states (``fuse``) or the head's own guesses."""
        embeds = self.embed(tokens.to(self.embed.weight.device)).to(self.device, torch.float32)
        if fuse:
            features = self.head.fused(features)
        return self.head(embeds[None], features[None], self.cache, start)[0, -1]

    def _logits(self, guess: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary for one guess or a row of them (-inf outside --top-vocab)."""
        logits = self._score(guess)
        if self.allowed is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.allowed] = logits
        return full


class HeadTree(Composite):
    """A HeadDrafter drafting trees: the engine's K is the node budget (``generate --tree N``)."""

    drafts_trees = True  # whatever the head it wraps says: here it drafts nothing but trees

    def __init__(self, head: HeadDrafter, width: int = TreeShape.width, depth: int = TreeShape.depth):
        self.head, self.width, self.depth = head, width, depth
        self.name = f"{head.name}-tree"

    def components(self) -> tuple[Drafter, ...]:
        return (self.head,)

    def reset(self) -> None:
        self.head.reset()

    def observe(self, verified) -> None:
        self.head.observe(verified)

    def propose(self, context, k, sampling, noise, gate=None) -> Draft:
        return self.head.propose_tree(context, TreeShape(k, self.width, self.depth))
