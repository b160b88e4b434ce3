"""Named target/draft pairs from ``models.yaml``.

The file is looked up in this order: ``--models FILE``, ``$SPECDEC_MODELS``, ``./models.yaml``,
then the copy shipped inside the package. A pair names its target, its drafter (a model, or
``ngram`` for prompt lookup, or a draft head made by ``specdec train-draft``), the default K, optional
per-scenario K and placement, and optionally the calibration profile file (``profile:``, see profile.py).

A pair may also list other drafters under ``drafters:`` (kind → drafter), so that trained drafters
stay selectable (``--drafter KIND``, bench's modes) while ``draft:`` stays the one used by default.
The file is read within bounds (yaml_input.py: its size, what its aliases expand to, its depth).
Relative paths in the file are taken against the directory of the file itself, symlinks resolved:
the repository's top-level ``models.yaml`` links to the packaged one, and both must find the
drafters shipped next to the packaged one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import UserError
from .free_kinds import FREE_KINDS, beside_kinds
from .fields import device_map, flag, k_value, known_keys, shown, text, whole_number
from .meta import read_meta
from .sources import ModelSource, resolve_path
from .yaml_input import load

PACKAGED_REGISTRY = Path(__file__).parents[1] / "models.yaml"
MODEL = "model"
NGRAM = "ngram"
HEAD = "head"
SUFFIX = "suffix"  # the free kind whose memory `generate --memory` keeps
STORE = "store"  # the free kind that drafts from a file of the target's answers (decoding/drafters/store.py)
# int8/int4/gguf: weight-only, on a CPU (quantize.py); gguf: a GGUF's tensors as the file holds them (gguf_linears.py)
DTYPES = ("auto", "float32", "float16", "bfloat16", "int8", "int4", "gguf")


@dataclass(frozen=True)
class ModelSpec:
    source: ModelSource
    dtype: str = "float32"
    device_map: str | dict = "auto"  # handed to accelerate: a device, "auto", or a module → device map


@dataclass(frozen=True)
class DrafterSpec:
    """A draft model, a draft head (a directory; it runs on its target's features), or a drafter
    without weights (both None then): n-gram lookup, token recycling, the suffix memory or a store
    (``answers``: its file of the target's answers)."""

    model: ModelSpec | None = None
    max_ngram: int = 3
    min_ngram: int = 1
    head: Path | None = None
    lookup: bool = False  # a model or head drafts only where prompt lookup finds nothing (drafters/lookup.LookupFirst)
    free_kind: str = NGRAM  # the weightless drafter's kind, when there is neither model nor head
    beside: tuple[str, ...] = ()  # free drafters `-k auto` weighs beside it each round (`free:` in models.yaml)
    answers: Path | None = None  # a store's answers file (decoding/drafters/store_file.py)

    @property
    def kind(self) -> str:
        return HEAD if self.head else MODEL if self.model else self.free_kind

    def __str__(self) -> str:
        text = (str(self.model.source) if self.model else f"head {self.head}" if self.head
                else FREE_KINDS[self.free_kind].text + (f" in {self.answers}" if self.answers else ""))
        text = f"{text}, after prompt lookup" if self.lookup else text
        return f"{text}; {', '.join(self.beside)} beside it under -k auto" if self.beside else text


@dataclass(frozen=True)
class PairSpec:
    name: str
    target: ModelSpec
    drafter: DrafterSpec
    k: int = 4
    scenarios: dict[str, int] = field(default_factory=dict)
    description: str = ""
    pad_blocks: bool = False  # run verify blocks at the cheapest measured length (blocks.py); for CPU targets
    adaptive: bool = False  # generate adapts K online by default (as with -k auto), from `k` or the profile
    profile: Path | None = None  # calibration profile file (`profile:` key, relative to models.yaml)
    alternates: dict[str, DrafterSpec] = field(default_factory=dict)  # kind → drafter, `drafter` included

    def k_for(self, scenario: str | None) -> int:
        return self.scenarios.get(scenario, self.k) if scenario else self.k

    def alternate(self, kind: str) -> DrafterSpec | None:
        """The pair's drafter of this kind: the current one if it is of that kind, else the one listed
        under ``drafters:``; a free drafter without a file needs nothing and is always there. None when
        there is none."""
        if self.drafter.kind == kind:
            return self.drafter
        always = kind in FREE_KINDS and not FREE_KINDS[kind].needs_source
        return self.alternates.get(kind) or (DrafterSpec(free_kind=kind) if always else None)


@dataclass(frozen=True)
class Registry:
    path: Path
    default: str
    pairs: dict[str, PairSpec]

    def pair(self, name: str | None) -> PairSpec:
        name = name or self.default
        if name not in self.pairs:
            raise UserError(f"unknown pair {name!r}; known pairs: {', '.join(sorted(self.pairs))} (from {self.path})")
        return self.pairs[name]


def registry_path(explicit: str | Path | None = None) -> Path:
    for candidate in (explicit, os.environ.get("SPECDEC_MODELS")):
        if candidate:
            path = Path(candidate)
            if path.is_dir():
                raise UserError(f"models file {path} is a directory; name the YAML file (models.yaml) itself")
            if not path.is_file():
                raise UserError(f"models file not found: {path}")
            return path
    local = Path("models.yaml")
    return local if local.is_file() else PACKAGED_REGISTRY


FILE_KEYS = ("default", "pairs")
PAIR_KEYS = ("description", "target", "draft", "drafters", "dtype", "k", "scenarios", "adaptive", "pad_blocks", "profile")
MODEL_KEYS = ("source", "dtype", "device_map")  # a target's mapping


def drafter_kinds() -> tuple[str, ...]:
    """Every drafter kind: a model, a head, and the free kinds (FREE_KINDS, as it is now)."""
    return (MODEL, HEAD, *FREE_KINDS)


def draft_keys(kind: str) -> tuple[str, ...]:
    """The keys a draft's mapping of this kind may have."""
    own = {HEAD: ("source", "lookup"), MODEL: (*MODEL_KEYS, "lookup")}
    return ("kind", *(own[kind] if kind in own else FREE_KINDS[kind].keys), "free")


def load_registry(explicit: str | Path | None = None) -> Registry:
    path = registry_path(explicit)
    data = load(path)
    if not isinstance(data, dict) or not isinstance(data.get("pairs"), dict) or not data["pairs"]:
        raise UserError(f"{path}: expected a mapping with a non-empty 'pairs' section")
    known_keys(data, FILE_KEYS, str(path))
    pairs = {name: _parse_pair(path, str(name), body) for name, body in data["pairs"].items()}
    default = str(data.get("default") or next(iter(pairs)))
    if default not in pairs:
        raise UserError(f"{path}: default pair {shown(default)} is not among the pairs")
    return Registry(path, default, pairs)


def _parse_pair(path: Path, name: str, body) -> PairSpec:
    where = f"{path}: pair {shown(name)}"
    base = path.resolve().parent  # through the symlink: where the file and its drafters really are
    if not isinstance(body, dict) or "target" not in body or "draft" not in body:
        raise UserError(f"{where} needs 'target' and 'draft'")
    known_keys(body, PAIR_KEYS, where)
    dtype = body.get("dtype", "float32")
    scenarios = body.get("scenarios") or {}
    if not isinstance(scenarios, dict):
        raise UserError(f"{where}: 'scenarios' must map scenario names to K")
    drafter = parse_drafter(body["draft"], dtype, where + " draft", base)
    pair = PairSpec(
        name=name,
        target=parse_model(body["target"], dtype, where + " target", base),
        drafter=drafter,
        k=k_value(body.get("k", 4), where),
        scenarios={str(s): k_value(v, f"{where} scenario {shown(s)}") for s, v in scenarios.items()},
        description=text(body, "description", where, default=""),
        pad_blocks=flag(body, "pad_blocks", where),
        adaptive=flag(body, "adaptive", where),
        profile=base / text(body, "profile", where, what="a file name") if body.get("profile") else None,
        alternates=_alternates(body.get("drafters"), drafter, dtype, where, base),
    )
    for kind in drafter.beside:
        if pair.alternate(kind) is None:
            raise UserError(f"{where}: 'free' lists {kind!r}, but the pair {MISSING[kind]}")
    return pair


def _alternates(listed, default: DrafterSpec, dtype: str, where: str, base: Path) -> dict[str, DrafterSpec]:
    """``drafters:`` as kind → drafter, plus the default under its own kind. A key must be a drafter
    kind and name a drafter of that kind, so that ``--drafter KIND`` can never pick a surprise."""
    listed = {} if listed is None else listed
    if not isinstance(listed, dict):
        raise UserError(f"{where}: 'drafters' must map drafter kinds ({', '.join(drafter_kinds())}) to drafters")
    found = {default.kind: default}
    for kind, value in listed.items():
        if kind not in drafter_kinds():
            raise UserError(f"{where}: unknown drafter kind {shown(kind)} under 'drafters'; "
                            f"use {', '.join(drafter_kinds())}")
        if kind in FREE_KINDS and FREE_KINDS[kind].needs_source and isinstance(value, str):
            value = {"kind": kind, "source": value}  # drafters: {store: FILE}
        spec = parse_drafter(value, dtype, f"{where} drafters.{kind}", base)
        if spec.kind != kind:
            hint = " (a head is a directory written by `specdec train-draft --kind head`)" if kind == HEAD else ""
            raise UserError(f"{where}: drafters.{kind} names a drafter of kind {spec.kind} ({spec}), not {kind}{hint}")
        if kind == default.kind and spec != default:
            raise UserError(f"{where}: drafters.{kind} ({spec}) differs from 'draft' ({default}); a pair has one drafter of each kind")
        found[kind] = spec
    return found


def parse_model(value, dtype: str = "float32", where: str = "model", base: Path | None = None) -> ModelSpec:
    """A source string, or a mapping with ``source`` and optional ``dtype`` / ``device_map``.
    ``base``: the directory a relative path is taken against (the registry's own), else the working one."""
    if isinstance(value, str):
        value = {"source": value}
    if not isinstance(value, dict) or "source" not in value:
        raise UserError(f"{where}: expected a source string or a mapping with 'source'")
    known_keys(value, MODEL_KEYS, where)
    dtype = str(value.get("dtype", dtype))
    if dtype not in DTYPES:
        raise UserError(f"{where}: dtype {shown(dtype)} is not one of {', '.join(DTYPES)}")
    return ModelSpec(ModelSource.parse(text(value, "source", where), base), dtype, device_map(value, where))


def parse_drafter(value, dtype: str = "float32", where: str = "draft", base: Path | None = None) -> DrafterSpec:
    """``ngram``, ``recycle``, ``suffix``, ``{kind: ngram, ...}``, ``{kind: head, source: DIR}``, a head
    directory, or a model."""
    if isinstance(value, dict):
        return _drafter_mapping(value, dtype, where, base)
    if isinstance(value, str) and value in FREE_KINDS:  # only a string names a kind (and a list is unhashable)
        if FREE_KINDS[value].needs_source:
            raise UserError(f"{where}: a {value} drafts from a file: name it as {{kind: {value}, source: FILE}}, "
                            f"or under `drafters: {{{value}: FILE}}` and pick it with --drafter {value}")
        return DrafterSpec(free_kind=value)
    if isinstance(value, str) and _is_head(resolve_path(value, base)):
        return DrafterSpec(head=resolve_path(value, base))
    return DrafterSpec(model=parse_model(value, dtype, where, base))


def _drafter_mapping(value: dict, dtype: str, where: str, base: Path | None) -> DrafterSpec:
    """A drafter's mapping, its keys those of its kind (a model's when it names none). ``lookup``
    puts prompt lookup first; ``free`` lists free drafters `-k auto` weighs beside it; a bare
    ``{source: ...}`` may name a head directory, as a string does."""
    kind = value.get("kind", MODEL)
    if kind not in drafter_kinds():
        raise UserError(f"{where}: 'kind' must be one of {', '.join(drafter_kinds())}, got {shown(kind)}")
    known_keys(value, draft_keys(kind), where)
    lookup, beside = flag(value, "lookup", where), free_beside(value, kind, where)
    if kind == NGRAM:
        low, high = whole_number(value, "min_ngram", where, 1), whole_number(value, "max_ngram", where, 3)
        if low > high:
            raise UserError(f"{where}: 'min_ngram' ({low}) must not exceed 'max_ngram' ({high})")
        return DrafterSpec(max_ngram=high, min_ngram=low, beside=beside)
    if kind in FREE_KINDS and FREE_KINDS[kind].needs_source:
        if not isinstance(value.get("source"), str):
            raise UserError(f"{where}: a {kind} needs 'source', the file of the target's answers it drafts from")
        return DrafterSpec(free_kind=kind, answers=resolve_path(value["source"], base), beside=beside)
    if kind in FREE_KINDS:
        return DrafterSpec(free_kind=kind, beside=beside)
    if kind == HEAD:
        if not isinstance(value.get("source"), str):
            raise UserError(f"{where}: a head needs 'source', the directory `specdec train-draft --kind head` wrote")
        return DrafterSpec(head=resolve_path(value["source"], base), lookup=lookup, beside=beside)
    rest = {key: v for key, v in value.items() if key not in ("kind", "lookup", "free")}
    if "kind" not in value and set(rest) == {"source"} and isinstance(rest["source"], str):
        return replace(parse_drafter(rest["source"], dtype, where, base), lookup=lookup, beside=beside)
    return DrafterSpec(model=parse_model(rest, dtype, where, base), lookup=lookup, beside=beside)


def free_beside(value: dict, kind: str, where: str) -> tuple[str, ...]:
    """``free: [recycle, suffix]``: the free drafters weighed beside this one, each once, never itself
    (prompt lookup beside a model or head is ``lookup: true``)."""
    listed = value.get("free") or []
    if not isinstance(listed, list) or not all(isinstance(name, str) for name in listed):
        listable = ", ".join(beside_kinds())
        raise UserError(f"{where}: 'free' must list drafter kinds, as in free: [{listable}]")
    allowed = tuple(k for k in beside_kinds() if k != kind)
    for name in listed:
        if name not in allowed or listed.count(name) > 1:
            raise UserError(f"{where}: 'free' lists {shown(name)}; it may list {', '.join(allowed)}, each once")
    return tuple(listed)


def _is_head(path: Path) -> bool:
    """A directory written by `train-draft --kind head`: its metadata file says so."""
    return path.is_dir() and (read_meta(path) or {}).get("kind") == HEAD


MISSING = {
    MODEL: "has no draft model; name one with --draft SOURCE or under `drafters: {model: ...}` in models.yaml",
    HEAD: "has no draft head; name one with --draft DIR (made by `specdec train-draft --kind head`) or under `drafters: {head: ...}`",
    STORE: "has no store; name a file of the target's answers under `drafters: {store: FILE}`",
}


def override(pair: PairSpec, target: str | None = None, draft: str | None = None, drafter: str | None = None,
             dtype: str | None = None) -> PairSpec:
    """Apply --target / --draft / --drafter / --dtype to a registry pair.

    --draft becomes the default drafter and replaces the pair's alternate of its kind (so bench's
    modes of that kind use it too), keeping whether prompt lookup drafts first there and which free
    drafters stand beside it: a head of
    one's own tried on the default pair is compared on the pair's terms, not without its lookup.
    --drafter KIND then picks the pair's drafter of that kind. --dtype sets the target's precision;
    drafters keep their own.
    """
    if dtype:
        if dtype not in DTYPES:
            raise UserError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
        pair = replace(pair, target=replace(pair.target, dtype=dtype))
    if target:
        pair = replace(pair, target=replace(pair.target, source=parse_model(target).source))
    if draft:
        chosen = parse_drafter(draft, pair.target.dtype, "--draft")
        replaced = pair.alternate(chosen.kind)
        if replaced is not None and chosen.kind not in FREE_KINDS:
            chosen = replace(chosen, lookup=replaced.lookup, beside=replaced.beside)
        pair = replace(pair, drafter=chosen, alternates={**pair.alternates, chosen.kind: chosen})
    if drafter:
        if drafter not in drafter_kinds():
            raise UserError(f"unknown drafter {drafter!r}; choose one of {', '.join(drafter_kinds())}")
        chosen = pair.alternate(drafter)
        if chosen is None:
            raise UserError(f"pair {pair.name!r} {MISSING[drafter]}")
        pair = replace(pair, drafter=chosen)
    return pair
