"""A pair made ready to run: the target and its drafter loaded, checked against each other, and
wired into an engine. Command-line overrides of the registry are applied here."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from .blocks import cached_plan
from .drafters import Drafter, ModelDrafter, NgramDrafter
from .engine import SpeculativeEngine
from .errors import UserError
from .head import load_head, read_meta
from .loading import LoadedModel, cache_root, load
from .registry import HEAD, NGRAM, DrafterSpec, PairSpec, parse_drafter, parse_model
from .tokenization import check_compatible, eos_ids

DRAFTER_KINDS = ("model", NGRAM, HEAD)


@dataclass
class Runtime:
    pair: PairSpec
    target: LoadedModel
    drafter: Drafter
    draft: LoadedModel | None  # the draft model, when the drafter is one
    block_plan: dict[int, int] = field(default_factory=dict)  # verify-block padding (blocks.py)

    @property
    def engine(self) -> SpeculativeEngine:
        return SpeculativeEngine(self.target.model, self.drafter, self.eos_token_ids, self.block_plan)

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def eos_token_ids(self) -> set[int]:
        return eos_ids(self.target.tokenizer, self.target.model.generation_config)


def override(pair: PairSpec, target: str | None = None, draft: str | None = None, drafter: str | None = None) -> PairSpec:
    """Apply --target / --draft / --drafter to a registry pair."""
    if target:
        pair = replace(pair, target=replace(pair.target, source=parse_model(target).source))
    if draft:
        dtype = pair.target.dtype
        pair = replace(pair, drafter=parse_drafter(draft, dtype, "--draft"))
    if drafter:
        if drafter not in DRAFTER_KINDS:
            raise UserError(f"unknown drafter {drafter!r}; choose one of {', '.join(DRAFTER_KINDS)}")
        if drafter == NGRAM and pair.drafter.kind != NGRAM:
            pair = replace(pair, drafter=DrafterSpec())
        elif drafter == "model" and pair.drafter.kind != "model":
            raise UserError(f"pair {pair.name!r} has no draft model; name one with --draft SOURCE")
        elif drafter == HEAD and pair.drafter.kind != HEAD:
            raise UserError(f"pair {pair.name!r} has no draft head; name one with --draft DIR (made by `specdec train-draft --kind head`)")
    return pair


def prepare(pair: PairSpec) -> Runtime:
    target = load(pair.target)
    runtime = Runtime(pair, target, *_drafter(pair.drafter, target))
    if pair.pad_blocks:
        runtime.block_plan = cached_plan(target.model, f"{target.source} {pair.target.dtype}", cache_root())
    return runtime


def _drafter(spec: DrafterSpec, target: LoadedModel) -> tuple[Drafter, LoadedModel | None]:
    if spec.head is not None:
        return load_head(spec.head, target.model, target.source), None
    if spec.model is None:
        return NgramDrafter(spec.max_ngram, spec.min_ngram), None
    draft = load(spec.model)
    check_compatible(target.tokenizer, draft.tokenizer)
    vocab = target.model.config.get_text_config().vocab_size
    top = (read_meta(draft.files) or {}).get("top_vocab") if draft.files else None  # a trained draft's output layer
    allowed = None if top is None else torch.tensor(top, dtype=torch.long)
    return ModelDrafter(draft.model, vocab, allowed), draft
