"""A saved draft head's files, read defensively: its metadata (``specdec-draft.json``) is checked for
the shape that loading relies on and its weights (``head.safetensors``) for being whole, so that a
head cut short by an interrupted copy, or edited by hand, is one line naming the file and what to
do, not a traceback from deep in safetensors or torch. Written here too (``save_head``), with the
identity of the target the head was trained for (``target_identity``), which loading checks."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..errors import UserError
from ..pairs.meta import META_FILE, damaged, read_meta, write_meta
from ..runtime.quantize import output_weight
from .head_network import TOP_ONLY, DraftHead

if TYPE_CHECKING:
    from transformers import PreTrainedModel

WEIGHTS_FILE = "head.safetensors"
FORMAT = 2  # meta "format": 1 (absent) = the last hidden state only; 2 adds "feature_layers"


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
    try:
        return meta, load_file(weights)
    except (SafetensorError, OSError) as exc:
        raise damaged(weights, f"cut short or damaged ({exc})") from None


def build_head(meta: dict, state: dict, directory, skeleton: bool = False) -> DraftHead:
    """The head its metadata describes, holding its weights. Weights of another shape (a file from
    another head, a layer shape edited by hand) are refused here, before anything runs on them."""
    try:
        head = DraftHead(meta["layer"], tuple(meta.get("feature_layers", TOP_ONLY)), skeleton=skeleton)
        head.load_state_dict(state, assign=skeleton)
    except (RuntimeError, TypeError, ValueError) as exc:
        first = " ".join(str(exc).replace("Error(s) in loading state_dict for DraftHead:", "").split())
        raise damaged(Path(directory) / WEIGHTS_FILE, f"does not hold the head its {META_FILE} describes ({first[:160]})") from None
    return head


def target_identity(model: PreTrainedModel, source, weight: torch.Tensor | None = None) -> dict:
    """The target a head belongs to: its source, and a hash of its shape and lm_head weight;
    ``weight``: the model's output_weight, where the caller holds it (a quantised table is
    de-quantised whole to get it).

    The weight is hashed in bfloat16 so that the same target loaded in float32 or bfloat16 matches.
    """
    c = model.config.get_text_config()
    shape = {k: getattr(c, k, None) for k in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers")}
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode())
    weight = (output_weight(model) if weight is None else weight).detach().to("cpu", torch.bfloat16).contiguous()
    digest.update(weight.view(torch.int16).numpy())
    return {"source": str(source), "fingerprint": digest.hexdigest()[:16]}


def save_head(directory: str | Path, head: DraftHead, meta: dict) -> None:
    """The head's weights and its metadata (``meta``: its target's identity, its layer's shape, ...)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in head.state_dict().items()}, directory / WEIGHTS_FILE)
    write_meta(directory, {**meta, "kind": "head", "format": FORMAT, "feature_layers": list(head.feature_layers)})


def check_target(meta: dict, directory, target: PreTrainedModel, source, weight: torch.Tensor | None = None) -> None:
    """Refuse a head trained for another target: its features would mean nothing to it (``weight``: as
    target_identity takes it)."""
    mine = target_identity(target, source, weight)
    theirs = meta.get("target", {})
    if theirs.get("fingerprint") != mine["fingerprint"]:
        raise UserError(
            f"draft head {directory} was trained for target {theirs.get('source')} (fingerprint "
            f"{theirs.get('fingerprint')}), not for {mine['source']} (fingerprint {mine['fingerprint']}); "
            "train one for this target with `specdec train-draft --kind head`"
        )


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
