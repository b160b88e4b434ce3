"""A pair made ready to run: the target and its drafter loaded, checked against each other, and
wired into an engine. (Command-line overrides of the registry live in pairs/registry.py.)

The pair's other drafters (``drafters:`` in models.yaml) load only when asked for
(``drafter_of``), so a command that uses one drafter never pays for the rest; plain decoding
(``load_pair(..., drafting=False)``) loads none. The draft head's module, which imports transformers'
modeling code, is imported only when a head is loaded, and a free kind's only when a pair uses it."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module

import torch

from ..errors import UserError
from ..pairs.cache_dir import open_cache
from ..pairs.free_kinds import FREE_KINDS
from ..pairs.loading import LoadedModel, load
from ..pairs.meta import read_meta
from ..pairs.profile import PairProfile
from ..pairs.registry import MISSING, DrafterSpec, PairSpec
from ..pairs.tokenization import check_compatible, eos_ids
from .blocks import block_plan, cached_context_slopes, cached_costs, relative_costs
from .control.controller import AdaptiveController
from .drafters.base import Drafter
from .drafters.beside import Beside
from .drafters.lookup import LookupFirst
from .drafters.model import ModelDrafter
from .engine import SpeculativeEngine


@dataclass
class LoadedPair:
    pair: PairSpec
    target: LoadedModel
    drafter: Drafter | None  # None: prepared for plain decoding only
    draft: LoadedModel | None  # the draft model, when the drafter is one
    block_plan: dict[int, int] = field(default_factory=dict)  # verify-block padding (blocks.py)
    block_costs: dict[int, float] = field(default_factory=dict)  # seconds per block length, measured (blocks.py)
    _by_kind: dict[str, tuple[Drafter, LoadedModel | None]] = field(default_factory=dict, repr=False)

    @property
    def engine(self) -> SpeculativeEngine:
        return SpeculativeEngine(self.target.model, self.drafter, self.eos_token_ids, self.block_plan)

    def fresh_engine(self, beside: tuple[str, ...]) -> SpeculativeEngine:
        """An engine whose drafter has learnt nothing yet, the free drafters of these kinds beside it
        made anew: a bench mode's, which must not draft from what another mode's run taught."""
        spec = self.pair.drafter
        drafter = composed(self.drafter_of(spec.kind)[0], spec.lookup, beside=free_drafters(beside, self.pair, self.target))
        return SpeculativeEngine(self.target.model, drafter, self.eos_token_ids, self.block_plan)

    def put_beside(self, free: Drafter) -> None:
        """Run this free drafter beside the running one from now on, for `-k auto` to weigh
        (generate --memory's suffix memory, where the pair lists none)."""
        self.drafter = Beside(self.drafter, (free,))

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def eos_token_ids(self) -> set[int]:
        return eos_ids(self.target.tokenizer, self.target.model.generation_config)

    def controller(self, profile: PairProfile | None, trees: bool = False, gating: bool = True) -> AdaptiveController:
        """The adaptive controller for this pair, seeded from ``profile``, else from the block costs
        and the drafter's recorded acceptance; ``gating``: the learned drafter's confidence gate."""
        return AdaptiveController.for_pair(self.pair, profile, trees, self.verify_costs(), self.expected_alpha(), gating,
                                           self.context_costs())

    def expected_alpha(self) -> float | None:
        """The default drafter's acceptance on prompts it never saw, as its metadata records it
        (``expected_alpha``, written when it was measured; trained/README.md), else None."""
        spec = self.pair.drafter
        files = spec.head if spec.head is not None else self.draft.files if self.draft is not None else None
        value = (read_meta(files) or {}).get("expected_alpha") if files is not None else None
        return float(value) if isinstance(value, (int, float)) and 0.0 <= value <= 1.0 else None

    def verify_costs(self) -> dict[int, float]:
        """Verify cost by K relative to one token, padding included: the adaptive controller's start."""
        return relative_costs(self.block_costs, self.block_plan)

    @property
    def costs_identity(self) -> str:
        """What the block-cost files are kept under, with the machine and code (blocks.cached_costs)."""
        return f"{self.target.source} {self.pair.target.dtype}"

    def context_costs(self) -> dict[int, float]:
        """Seconds a cached token adds to a verify block, by K (blocks.context_slopes): measured on
        first use and kept, as the block costs are; {} where those were not measured."""
        if not self.block_costs:
            return {}
        return cached_context_slopes(self.target.model, self.costs_identity, open_cache(), self.block_plan)

    def tree_drafter(self) -> Drafter:
        """The running drafter drafting trees (`--tree N`): its head's, prompt lookup still first
        where the pair puts it there."""
        spec = self.pair.drafter
        return composed(self.drafter_of(spec.kind)[0], spec.lookup, tree=True, beside=free_drafters(spec.beside, self.pair, self.target))

    def drafter_of(self, kind: str) -> tuple[Drafter, LoadedModel | None]:
        """The pair's drafter of this kind for the loaded target, and its draft model when it is one,
        as it is: without the prompt lookup the running drafter may put first (bench's modes say
        whether they want it). Loaded on first use and kept: bench runs one kind in several modes,
        spec:K and hf-assisted:K share a draft model, and the running drafter's own is already here."""
        if kind not in self._by_kind:
            spec = self.pair.alternate(kind)
            if spec is None:
                raise UserError(f"pair {self.pair.name!r} {MISSING[kind]}")
            self._by_kind[kind] = _drafter(spec, self.target)
        return self._by_kind[kind]


def composed(drafter: Drafter, lookup: bool, tree: bool = False, beside: tuple[Drafter, ...] = ()) -> Drafter:
    """The drafter a run drives, made from one of the pair's: its draft head drafting trees
    (`--tree`, tree modes), prompt lookup first (the pair's `lookup:`, ngram+ modes), and free
    drafters beside it for `-k auto` to weigh (the pair's `free:`). With LoadedPair.put_beside, the
    one place drafters are wrapped. Only a head drafts trees."""
    if tree:
        from .drafters.head import HeadDrafter, HeadTree

        if not isinstance(drafter, HeadDrafter):
            raise ValueError(f"trees are drafted by a draft head, not by {drafter.name!r}")  # commands check the pair first
        drafter = HeadTree(drafter)
    drafter = LookupFirst(drafter) if lookup else drafter
    return Beside(drafter, beside) if beside else drafter


def free_drafters(kinds: tuple[str, ...], pair: PairSpec, target: LoadedModel) -> tuple[Drafter, ...]:
    """New free drafters of these kinds, the pair's (a store's file is the pair's), for the target:
    each run that should learn afresh gets its own."""
    return tuple(_drafter(pair.alternate(kind), target)[0] for kind in kinds)


def load_pair(pair: PairSpec, drafting: bool = True, lean: bool = False) -> LoadedPair:
    """``drafting=False``: no drafter is loaded (plain decoding, `-k 0`); ``lean``: the target may
    come without transformers' model class (pairs/loading.py), for a command that only decodes."""
    target = load(pair.target, lean)
    if not drafting:
        runtime = LoadedPair(pair, target, None, None)
    else:
        drafter, draft = _drafter(pair.drafter, target)
        running = composed(drafter, pair.drafter.lookup, beside=free_drafters(pair.drafter.beside, pair, target))
        runtime = LoadedPair(pair, target, running, draft, _by_kind={pair.drafter.kind: (drafter, draft)})
    if pair.pad_blocks:
        runtime.block_costs = cached_costs(target.model, runtime.costs_identity, open_cache())
        runtime.block_plan = block_plan(runtime.block_costs)
    return runtime


def _drafter(spec: DrafterSpec, target: LoadedModel) -> tuple[Drafter, LoadedModel | None]:
    if spec.head is not None:
        from .drafters.head import load_head

        return load_head(spec.head, target.model, target.source, target.precision), None
    if spec.model is None:
        return free_drafter(spec, target.model.config.get_text_config().vocab_size), None
    draft = load(spec.model, accept=lambda tokenizer: check_compatible(target.tokenizer, tokenizer))  # before it is prepared
    vocab = target.model.config.get_text_config().vocab_size
    top = (read_meta(draft.files) or {}).get("top_vocab") if draft.files else None  # a trained draft's output layer
    allowed = None if top is None else torch.tensor(top, dtype=torch.long)
    return ModelDrafter(draft.model, vocab, allowed), draft


def free_drafter(spec: DrafterSpec, vocab_size: int) -> Drafter:
    """A drafter without weights, by its kind's line in pairs/free_kinds.py: its class, named by its
    full dotted path ("package.module:Class"), built by the class's ``for_pair``."""
    module, name = FREE_KINDS[spec.free_kind].drafter.split(":")
    return getattr(import_module(module), name).for_pair(spec, vocab_size)
