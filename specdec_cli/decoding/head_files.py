"""A saved draft head's files, read defensively: its metadata (``specdec-draft.json``) is checked for
the shape that loading relies on and its weights (``head.safetensors``) for being whole, so that a
head cut short by an interrupted copy, or edited by hand, is one line naming the file and what to
do, not a traceback from deep in safetensors or torch."""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from ..pairs.meta import META_FILE, damaged, read_meta

WEIGHTS_FILE = "head.safetensors"


def read_head(directory: Path) -> tuple[dict, dict]:
    """A saved head's metadata and weights, refused unless the directory holds one (train-draft --kind head)."""
    directory = Path(directory)
    meta = read_meta(directory)
    weights = directory / WEIGHTS_FILE
    if meta is None or meta.get("kind") != "head" or not weights.is_file():
        raise UserError(f"{directory} is not a draft head (no {META_FILE} of kind 'head' with {WEIGHTS_FILE})")
    problem = meta_problem(meta)
    if problem:
        raise damaged(directory / META_FILE, problem)
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return meta, load_file(weights)
    except (SafetensorError, OSError) as exc:
        raise damaged(weights, f"cut short or damaged ({exc})") from None


def build_head(meta: dict, state: dict, directory, skeleton: bool = False):
    """The head its metadata describes, holding its weights. Weights of another shape (a file from
    another head, a layer shape edited by hand) are refused here, before anything runs on them."""
    from .head import TOP_ONLY, DraftHead  # torch and transformers: once a head is to run

    try:
        head = DraftHead(meta["layer"], tuple(meta.get("feature_layers", TOP_ONLY)), skeleton=skeleton)
        head.load_state_dict(state, assign=skeleton)
    except (RuntimeError, TypeError, ValueError) as exc:
        first = " ".join(str(exc).replace("Error(s) in loading state_dict for DraftHead:", "").split())
        raise damaged(Path(directory) / WEIGHTS_FILE, f"does not hold the head its {META_FILE} describes ({first[:160]})") from None
    return head


def meta_problem(meta: dict) -> str | None:
    """What in a head's metadata is not of the shape loading reads, in words; None when all of it is."""
    layer, target, top = meta.get("layer"), meta.get("target"), meta.get("top_vocab")
    features = meta.get("feature_layers", [-1])
    if not isinstance(layer, dict):
        return f"'layer' must be a mapping (the head's layer shape), got {_shown(layer)}"
    if not (isinstance(target, dict) and isinstance(target.get("source"), str) and isinstance(target.get("fingerprint"), str)):
        return f"'target' must be a mapping with 'source' and 'fingerprint', got {_shown(target)}"
    if not (_whole_numbers(features) and features):
        return f"'feature_layers' must be a list of whole numbers, got {_shown(features)}"
    if top is not None and not (_whole_numbers(top) and all(token >= 0 for token in top)):
        return f"'top_vocab' must be a list of token ids or null, got {_shown(top)}"
    if not _whole_number(meta.get("format", 1)):
        return f"'format' must be a whole number, got {_shown(meta['format'])}"
    return None


def _whole_number(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _whole_numbers(value) -> bool:
    return isinstance(value, list) and all(_whole_number(v) for v in value)


def _shown(value) -> str:
    """A value as the file has it, cut short: a top_vocab holds thousands of ids."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
