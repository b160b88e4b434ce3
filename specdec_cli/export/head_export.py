"""`specdec export-head DIR --format eagle3`: a specdec head written in the layout vLLM loads as
``method: eagle3``, with the target's lm_head rows as the draft vocabulary, and how well the map
kept the head's guesses (eagle3.py says which parts are exact and which approximate).

Agreement is teacher-forced at the first drafted position: at every position of a few prompts,
does the head's top-1 equal the target's next token? Both heads read the same target states, so
the difference is what the map loses; acceptance inside vLLM is measured by the round trip.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..decoding.head_files import build_head, check_target, read_head
from ..decoding.head_network import TOP_ONLY, DraftHead
from ..errors import UserError
from ..runtime.quantize import output_weight
from .eagle3 import ENGINE_LAYERS, Stats, aux_layer_ids, eagle3_config, last_state_id, map_head, save_eagle3, vocab_maps

FORMATS = ("eagle3",)
FALLBACK_TEXTS = ("Write a Python function that reverses a string.", "What is the capital of France, and why is it famous?",
                  "Explain in two sentences how a refrigerator keeps food cold.")


@dataclass(frozen=True)
class HeadExport:
    directory: Path
    aux_ids: list[int]
    draft_vocab: int
    agreement_specdec: float
    agreement_exported: float
    positions: int


def sample_ids(directory: Path, tokenizer, count: int = 12) -> list[list[int]]:
    """Prompts to measure on: the head's own held-out prompts when it ships them, chat template applied."""
    from ..pairs.tokenization import encode_prompt

    texts = []
    heldout = directory / "heldout.jsonl"
    if heldout.is_file():
        for line in heldout.read_text(encoding="utf-8").splitlines()[:count]:
            texts.append(json.loads(line)["prompt"])
    return [encode_prompt(tokenizer, text, False) for text in (texts or FALLBACK_TEXTS)]


def target_forward(model, ids: list[int], for_training: bool = False) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """transformers' hidden_states (each (T, H)) and, appended, the last layer's output before the
    final norm (vLLM's aux L), caught by a hook (transformers hands only the normed one); and the
    (T, vocab) logits. ``for_training``: under no_grad rather than inference_mode, because
    inference-mode tensors cannot be saved for backward and a head trained on these states needs that."""
    caught = []
    hook = model.model.layers[-1].register_forward_hook(
        lambda module, args, output: caught.append(output[0] if isinstance(output, tuple) else output))
    try:
        with torch.no_grad() if for_training else torch.inference_mode():
            # transformers' own forward even where a lean one is installed (runtime/lean_forward.py,
            # an int8/int4 target): only it calls the layer modules the hook sits on.
            out = type(model).forward(model, torch.tensor([ids]), output_hidden_states=True)
    finally:
        hook.remove()
    return (*(h[0].float() for h in out.hidden_states), caught[-1][0].float()), out.logits[0].float()


def target_states(model, ids: list[int]) -> tuple[torch.Tensor, ...]:
    """target_forward's states alone."""
    return target_forward(model, ids)[0]


def aux_states(hidden: tuple[torch.Tensor, ...], aux_ids: list[int]) -> torch.Tensor:
    """vLLM's concatenated aux states from target_forward's: id i is hidden_states[i], id L the
    appended pre-norm last state."""
    return torch.cat([hidden[i] if i < len(hidden) - 2 else hidden[-1] for i in aux_ids], dim=-1)


@torch.no_grad()
def measure_stats(spec: dict[str, torch.Tensor], feature_layers, states: list, embed, last_id: int) -> Stats:
    """The magnitudes map_head needs, averaged over positions of the sample prompts; ``last_id``: the
    aux id that stands in for specdec's last state."""
    h = spec["fc.weight"].shape[0]
    last, over_e, over_h, inverse, over_f = [], [], [], [], []
    for hidden, ids in states:
        last.append(aux_states(hidden, [last_id]).pow(2).mean(-1).sqrt())
        feature = torch.cat([hidden[:-1][i] for i in feature_layers], dim=-1)[:-1]
        fused = feature @ spec["fuse.weight"].T if "fuse.weight" in spec else feature
        e = embed(torch.tensor(ids[1:])).float()
        x = e @ spec["fc.weight"][:, :h].T + fused @ spec["fc.weight"][:, h:].T + spec["fc.bias"]
        h0 = fused @ spec["fc.weight"][:, h:].T
        norm = lambda t: t.pow(2).mean(-1).sqrt()
        over_e.append(norm(e) / norm(x)), over_h.append(norm(h0) / norm(x)), inverse.append(1 / norm(x))
        over_f.append(norm(fused) / norm(x))
    mean = lambda parts: float(torch.cat(parts).mean())
    return Stats(mean(last), mean(over_e), mean(over_h), mean(inverse), mean(over_f))


def agreement(model, spec_head: DraftHead, eagle, feature_layers, aux_ids, states: list, embed) -> tuple[float, float, int]:
    """Teacher-forced top-1 agreement with the target at the first drafted position, both heads."""
    hits_spec = hits_eagle = total = 0
    allowed = eagle.d2t + torch.arange(eagle.d2t.numel())
    rows = output_weight(model)[allowed].float()
    with torch.inference_mode():
        for hidden, ids in states:
            e = embed(torch.tensor(ids[1:])).float()
            feature = torch.cat([hidden[:-1][i] for i in feature_layers], dim=-1)[:-1]
            guess = spec_head(e[None], spec_head.fused(feature)[None])[0]
            spec_top = allowed[(guess @ rows.T).argmax(-1)]
            aux = aux_states(hidden, aux_ids)[:-1]
            prenorm = eagle(e, eagle.combine(aux))
            eagle_top = eagle.target_logits(prenorm).argmax(-1)
            want = _greedy(model, ids)[1:]
            hits_spec += int((spec_top == want).sum())
            hits_eagle += int((eagle_top == want).sum())
            total += want.numel()
    return hits_spec / max(total, 1), hits_eagle / max(total, 1), total


def _greedy(model, ids) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids])).logits[0].argmax(-1)


def export_head(directory: Path, out: Path, fmt: str, load_target, space: str = "fc", engine: str = "vllm") -> HeadExport:
    """Write ``out`` from the head in ``directory``; ``load_target(source)`` gives (model, tokenizer);
    ``space``: eagle3.map_head's; ``engine``: whose EAGLE-3 layer (eagle3.ENGINE_LAYERS)."""
    if fmt not in FORMATS:
        raise UserError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if engine not in ENGINE_LAYERS:
        raise UserError(f"unknown --engine {engine!r}; choose one of {', '.join(ENGINE_LAYERS)}")
    layer = ENGINE_LAYERS[engine]
    meta, spec = read_head(directory)
    spec_head = build_head(meta, spec, directory).eval()  # a damaged head is refused before the target loads
    model, tokenizer = load_target(meta["target"]["source"])
    check_target(meta, directory, model, meta["target"]["source"])
    text = model.config.get_text_config()
    feature_layers = tuple(meta.get("feature_layers", TOP_ONLY))
    try:
        aux_ids = aux_layer_ids(feature_layers, text.num_hidden_layers, layer.last_output)
    except ValueError as exc:
        raise UserError(f"{directory} cannot be exported for {engine}: {exc}") from None
    d2t, t2d = vocab_maps(meta.get("top_vocab"), text.vocab_size)
    config = eagle3_config(meta["layer"], text.to_dict(), aux_ids, d2t.numel(), attention_bias=layer.attention_bias)
    final_norm = model.model.norm.weight.detach().float()
    embed = model.get_input_embeddings()
    states = [(target_states(model, ids), ids) for ids in sample_ids(directory, tokenizer)]
    stats = measure_stats(spec, feature_layers, states, embed, last_state_id(text.num_hidden_layers, layer.last_output))
    allowed = d2t + torch.arange(d2t.numel())
    eagle = map_head(spec, feature_layers, config, final_norm, output_weight(model)[allowed].detach().float(), d2t, t2d, stats, space)
    kept, mapped, positions = agreement(model, spec_head, eagle, feature_layers, aux_ids, states, embed)
    provenance = {"from": str(directory), "engine": engine, "target": meta["target"], "feature_layers": list(feature_layers),
                  "aux_layer_ids": aux_ids, "stats": stats.__dict__, "map": f"approximate (specdec_cli/export/eagle3.py), h in the {space!r} space",
                  "teacher_forced_agreement": {"specdec_head": round(kept, 4), "exported": round(mapped, 4), "positions": positions}}
    save_eagle3(Path(out), eagle, provenance)
    return HeadExport(Path(out), aux_ids, d2t.numel(), kept, mapped, positions)
