"""The bench's mode kinds: the one list of what `specdec bench --modes` runs, what each mode is, and the
`--modes` help made from it. Every free drafter is a mode of its own name (KIND:K), listed and described
by its line in pairs/free_kinds.py, read when asked: a new free kind is a mode, in the help too, with
no line here.

Nothing here imports torch: the command line builds its help from it."""

from __future__ import annotations

from ..pairs import free_kinds
from ..pairs.registry import HEAD, MODEL, NGRAM

LOOKUP_FIRST = "prompt lookup first, the model or head where it finds nothing"
TREE = "the head drafting a tree of at most N nodes, verified in one forward"
# Each mode kind but the free drafters' and what it is, in the order the help lists them: transformers'
# generate after plain, the free drafters after spec. All but transformers' run on this loop.
BEFORE_FREE = {
    "plain": "this loop without a drafter",
    "hf-plain": "transformers' generate",
    "hf-assisted": "transformers' generate assisted by the pair's draft model",
    "hf-lookup": "transformers' generate with its prompt lookup",
    "spec": "the pair's draft model",
}
AFTER_FREE = {
    "head": "the pair's draft head",
    "ngram+spec": LOOKUP_FIRST,
    "ngram+head": LOOKUP_FIRST,
    "auto": "the default drafter with adaptive K, as `generate -k auto`, seeded from the calibration profile",
    "auto-ungated": "auto without the head's confidence gate: every round drafts the K chosen",
    "auto+tree": "auto weighing the head's trees too, as `generate --tree auto`",
    "auto+free": "auto with every free drafter the pair has beside its drafter",
    "auto-free": "auto with no free drafter beside its drafter",
    "tree": TREE,
    "ngram+tree": TREE,
}
HF_KINDS = ("hf-plain", "hf-assisted", "hf-lookup")  # run by transformers' generate
TREE_KINDS = ("tree", "ngram+tree")  # the pair's head drafting trees of at most K nodes
DRAFTS_TREES = (*TREE_KINDS, "auto+tree")  # modes whose rounds may verify a tree
AUTO_KINDS = ("auto", "auto-ungated", "auto+tree", "auto+free", "auto-free")  # adaptive K
WITHOUT_K = ("plain", "hf-plain", *AUTO_KINDS)
# the pair's drafter each mode runs, but for the free drafters' own modes (each runs its own kind)
DRAFTER_OF_MODE = {"spec": MODEL, "hf-assisted": MODEL, "head": HEAD, "hf-lookup": NGRAM, "ngram+spec": MODEL,
                   "ngram+head": HEAD, "tree": HEAD, "ngram+tree": HEAD}


def described() -> dict[str, str]:
    """Every mode kind and what it is, in the order the help lists them, the free kinds as their table is now."""
    return {**BEFORE_FREE, **{name: kind.what for name, kind in free_kinds.FREE_KINDS.items()}, **AFTER_FREE}


def mode_kinds() -> tuple[str, ...]:
    """Every mode kind `--modes` takes."""
    return tuple(described())


def engine_kinds() -> tuple[str, ...]:
    """The mode kinds this loop runs (the others are transformers' generate)."""
    return tuple(kind for kind in described() if kind not in HF_KINDS)


def drafter_of(kind: str) -> str | None:
    """The kind of drafter a mode runs: a free kind's mode its own; None for plain decoding and auto."""
    return kind if kind in free_kinds.FREE_KINDS else DRAFTER_OF_MODE.get(kind)


def running_kind(drafter_kind: str, lookup: bool) -> str:
    """The mode kind that drafts as a pair's drafter of ``drafter_kind`` does, prompt lookup first where
    the pair puts it there (``lookup``): spec or head, ngram+ either; ngram and a free kind their own."""
    own = {MODEL: "spec", HEAD: "head"}.get(drafter_kind, drafter_kind)
    return f"ngram+{own}" if lookup and own in ("spec", "head") else own


def free_kinds_of(kind: str, listed: tuple[str, ...]) -> tuple[str, ...]:
    """The free kinds an auto mode puts beside the pair's drafter: auto+free every kind `free:` may
    list, auto-free none, the others those the pair lists (``listed``)."""
    return {"auto+free": free_kinds.beside_kinds(), "auto-free": ()}.get(kind, listed)


def written(kind: str) -> str:
    """A mode kind as `--modes` takes it: plain, spec:K, tree:N."""
    return kind if kind in WITHOUT_K else f"{kind}:N" if kind in TREE_KINDS else f"{kind}:K"


def mode_names() -> str:
    """Every mode as `--modes` takes it: plain, hf-assisted:K, ..., tree:N."""
    return ", ".join(written(kind) for kind in described())


def modes_help() -> str:
    """Every mode as `--modes` takes it, with what it is; neighbours that are the same thing but for
    one part (ngram+spec:K, ngram+head:K) share one description."""
    groups: list[tuple[list[str], str]] = []
    for kind, what in described().items():
        if groups and groups[-1][1] == what:
            groups[-1][0].append(written(kind))
        else:
            groups.append(([written(kind)], what))
    return ", ".join(f"{', '.join(names)} ({what})" for names, what in groups)
