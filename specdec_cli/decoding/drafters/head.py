"""The draft head's drafters (``head``): ``HeadDrafter`` drafts chains with a DraftHead
(decoding/head_network.py) on the target's features, ``HeadTree`` the same head's trees; ``load_head``
makes one from a saved head's files (decoding/head_files.py), refused unless they were trained for
this very target."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...errors import UserError
from ...limits import MAX_K
from ...runtime.block_embedding import embedding_device
from ...runtime.quantize import QUANTISED, native_linear, output_weight, quantise_model, quantised_weight
from ...runtime.rowwise_attention import on_native_kernels
from ..control.gate import DraftGate
from ..head_files import FORMAT, build_head, check_target, read_head
from ..head_network import DraftHead, head_logits
from ..kv import crop_cache, reserved_cache
from ..tree import TreeShape, best_nodes, path_to
from .base import Composite, Draft, Drafter, Needs, TreeDrafting, TreesOnly, Verified, autoregress, common_prefix

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def load_head(directory: str | Path, target: PreTrainedModel, source, precision: str = "float32") -> "HeadDrafter":
    """The head saved in ``directory``, refused unless it was trained for this very target;
    ``precision``: the target's dtype, which the head follows (see HeadDrafter)."""
    meta, state = read_head(Path(directory))
    weight = output_weight(target)  # de-quantised once for the check and the head's output rows
    check_target(meta, directory, target, source, weight)
    if meta.get("format", 1) > FORMAT:
        raise UserError(f"draft head {directory} has format {meta['format']}, newer than this specdec reads ({FORMAT}); upgrade specdec")
    quantised = precision in QUANTISED  # drafts with the lean forward: no transformers layer unless asked for
    head = build_head(meta, state, directory, skeleton=quantised)
    top = meta.get("top_vocab")
    return HeadDrafter(head, target, None if top is None else torch.tensor(top, dtype=torch.long), precision, weight)


class HeadDrafter(Drafter, TreeDrafting):
    """Drafts with a DraftHead on the target's features, which the engine hands over as tokens are
    confirmed (``observe``), in chains or, when asked, trees (``propose_tree``).

    The head's KV cache keeps only positions computed from the target's true features; the
    positions it drafted on its own guesses are cropped away each round, and the newly confirmed
    ones enter with the target's features in the same forward that starts the next draft.

    A head whose target runs weight-only int8 or int4 (``precision``) runs int8: its linears and
    output rows on the target's kernels (specdec's where the target's are), fused like the target's
    (runtime/quantize.py), its layer through the lean path. Between two target forwards its weights leave the CPU's caches, so a
    draft is paid in bytes: int8 made the shipped head's rounds much cheaper than float32 at the
    same acceptance; int4 saved a little more draft time but lost as much in acceptance, a wash
    (docs/notebook.md, "What was tried"). Only the drafts change, never what the target accepts.
    """

    name = "head"

    def __init__(self, head: DraftHead, target: PreTrainedModel, allowed: torch.Tensor | None = None,
                 precision: str = "float32", weight: torch.Tensor | None = None):
        """``weight``: the target's output_weight, where the caller holds it."""
        weight = output_weight(target) if weight is None else weight  # float even when the target's lm_head is quantised
        self.device = weight.device
        self.precision = "int8" if precision in QUANTISED else "float32"
        self.head = head.to(self.device).eval()
        native = self.precision in QUANTISED and on_native_kernels(target)
        if self.precision in QUANTISED:  # a copy: the float head may be shared (training, tests)
            self.head = quantise_model(copy.deepcopy(self.head), self.precision, native=native)
            self.head.go_lean(native)
        self.needs = Needs(features=head.feature_layers)
        self.embed = target.get_input_embeddings()
        self.embed_device = embedding_device(self.embed)
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
        self._rows = torch.zeros(256, len(self.needs.features) * self.head.config.hidden_size, device=self.device)
        self._count = 1

    @property
    def features(self) -> torch.Tensor:
        """The target's features handed over so far, one row per confirmed position."""
        return self._rows[1 : self._count]

    def observe(self, verified: Verified) -> None:
        """Take the target's features of the newly confirmed positions."""
        if verified.features is None:
            return
        rows = verified.features
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
            embeds = self.embed(torch.tensor([tokens[i] for i in frontier]).to(self.embed_device))
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
        embeds = self.embed(tokens.to(self.embed_device)).to(self.device, torch.float32)
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


class HeadTree(TreesOnly, Composite):
    """A HeadDrafter drafting trees: the engine's K is the node budget (``generate --tree N``)."""

    def __init__(self, head: HeadDrafter, width: int = TreeShape.width, depth: int = TreeShape.depth):
        self.head, self.width, self.depth = head, width, depth
        self.name = f"{head.name}-tree"

    def components(self) -> tuple[Drafter, ...]:
        return (self.head,)

    def fork(self) -> HeadTree:
        return HeadTree(self.head.fork(), self.width, self.depth)

    def reset(self) -> None:
        self.head.reset()

    def observe(self, verified) -> None:
        self.head.observe(verified)

    def propose(self, context, k, sampling, noise, gate=None) -> Draft:
        return self.head.propose_tree(context, TreeShape(k, self.width, self.depth))
