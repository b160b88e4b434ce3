"""One `specdec train-draft` run: data (made once, kept in the checkpoint), training, the saved drafter.

Layout of ``--out``: the drafter itself (a transformers model directory, or ``head.safetensors``),
``specdec-draft.json`` (kind, target identity, output-layer ids, how it was trained),
``heldout.jsonl`` (the prompts it never saw, to benchmark on), and ``checkpoint/`` (teacher data and
trainer state) from which ``--resume`` continues. The terminal is not this module's business: it
reports through a ``Reporter``.
"""

from __future__ import annotations

import json
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from ..decoding.head_files import save_head, target_identity
from ..errors import UserError, first_line
from ..pairs.loading import LoadedModel, load
from ..pairs.meta import write_meta
from ..pairs.registry import ModelSpec
from ..pairs.tokenization import eos_ids
from ..prompts import read_file
from .distill import AnswerSettings, Example, answer, encode, split, teacher, top_vocab
from .loop import Budget, HeadStudent, ModelStudent, Trainer, draft_from_target, narrow_draft, new_head, save_atomically

TRAINABLE = ("model", "head")  # the drafter kinds train-draft makes
DEFAULT_LR = {"model": 1e-4, "head": 1e-3}
DATA_KEYS = ("kind", "target", "seed", "top_k", "prompts", "heldout", "top_vocab", "examples")  # _make_data()'s
STATE_KEYS = ("student", "optimizer", "step", "rng", "torch_rng", "history")  # Trainer.checkpoint()'s


class Reporter(Protocol):
    def phase(self, description: str, total: int | None) -> None: ...

    def advance(self, count: int = 1, **fields) -> None: ...


@dataclass
class JobSettings:
    kind: str
    prompts: Path | None
    out: Path
    target: ModelSpec
    steps: int | None = None
    minutes: float | None = None
    seed: int = 0
    top_k: int = 64
    top_vocab: int = 0
    holdout: float = 0.1
    lr: float | None = None
    batch_size: int = 8
    raw: bool = False
    resume: bool = False
    data_from: Path | None = None  # another run's --out: reuse its target answers instead of making new ones
    hidden_size: int = 0  # model kind: 0 = the target's width (2 of its layers); else a fresh narrow model
    layers: int = 0  # model kind: decoder layers (0: 2 of the target's, or 4 in a narrow model)
    answers: AnswerSettings = field(default_factory=AnswerSettings)

    def check(self) -> None:
        if self.kind not in TRAINABLE:
            raise UserError(f"unknown drafter kind {self.kind!r}; choose one of {', '.join(TRAINABLE)}")
        if self.prompts is None and not (self.resume or self.data_from):
            raise UserError("give the prompts to train on with --prompts FILE (or reuse a run's with --data-from DIR)")
        if self.prompts is not None and self.data_from:
            raise UserError("--data-from reuses that run's prompts and answers; drop --prompts")
        if self.steps is None and self.minutes is None:
            raise UserError("give a training budget: --steps N and/or --minutes M")
        for name, value, low in (("--steps", self.steps, 0), ("--minutes", self.minutes, 0), ("--top-k", self.top_k, 1),
                                 ("--batch-size", self.batch_size, 1), ("--answer-batch-size", self.answers.batch_size, 1),
                                 ("--max-new-tokens", self.answers.max_new_tokens, 1),
                                 ("--top-vocab", self.top_vocab, 0), ("--hidden-size", self.hidden_size, 0),
                                 ("--layers", self.layers, 0)):
            if value is not None and value < low:
                raise UserError(f"{name} must be at least {low}, got {value}")
        if not 0 < self.holdout < 1:
            raise UserError(f"--holdout must be between 0 and 1, got {self.holdout}")


def run(settings: JobSettings, reporter: Reporter) -> dict:
    settings.check()
    checkpoint = settings.out / "checkpoint"
    if not settings.resume and any((checkpoint / name).is_file() for name in ("data.pt", "state.pt")):
        raise UserError(f"{settings.out} holds a checkpoint: pass --resume to continue it, or choose another --out")
    if settings.resume and not (checkpoint / "data.pt").is_file():
        raise UserError(f"nothing to resume: no checkpoint in {checkpoint}")
    # read before the target loads: a file that is not specdec's is refused at once
    resumed = load_checkpoint(checkpoint / "data.pt", DATA_KEYS) if settings.resume else None
    state = (load_checkpoint(checkpoint / "state.pt", STATE_KEYS)
             if settings.resume and (checkpoint / "state.pt").is_file() else None)
    reporter.phase("loading the target", None)
    target = load(settings.target)
    torch.manual_seed(settings.seed)
    identity = target_identity(target.model, target.source)
    eos = eos_ids(target.tokenizer, target.model.generation_config)
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else min(eos)
    if resumed is not None:
        data = _resumed_data(resumed, checkpoint, settings, identity)
    elif settings.data_from:
        data = _reused_data(settings, target, identity, eos, pad, reporter)
        checkpoint.mkdir(parents=True, exist_ok=True)
        save_atomically(data, checkpoint / "data.pt")
    else:
        data = _make_data(settings, target, identity, eos, pad, reporter)
        checkpoint.mkdir(parents=True, exist_ok=True)
        save_atomically(data, checkpoint / "data.pt")
    trainer = _trainer(data, target, settings, pad)
    if state is not None:
        trainer.restore(state)

    def save_state():
        save_atomically(trainer.checkpoint(), checkpoint / "state.pt")

    reporter.phase("training", settings.steps)
    if trainer.step:
        reporter.advance(trainer.step)
    trainer.run(Budget(settings.steps, settings.minutes),
                on_step=lambda step, loss: reporter.advance(loss=loss, agreement=_last_agreement(trainer)), save=save_state)
    save_state()
    agreement = trainer.agreement()
    meta = {
        "target": identity,
        "top_vocab": data["top_vocab"],
        "training": {"prompts": data["prompts"], "heldout_prompts": len(data["heldout"]), "seed": data["seed"],
                     "steps": trainer.step, "top_k": data["top_k"], "examples": len(trainer.train),
                     "heldout_agreement": agreement, "final_loss": trainer.history[-1]["loss"] if trainer.history else None},
    }
    _save(settings.out, data["kind"], trainer.student, target, meta)
    (settings.out / "heldout.jsonl").write_text("".join(json.dumps(p) + "\n" for p in data["heldout"]))
    return {"out": str(settings.out), "kind": data["kind"], "steps": trainer.step, "heldout_agreement": agreement,
            "final_loss": meta["training"]["final_loss"], "top_vocab": None if data["top_vocab"] is None else len(data["top_vocab"])}


def _trainer(data: dict, target: LoadedModel, settings: JobSettings, pad: int) -> Trainer:
    examples = [Example(**e) for e in data["examples"]]
    allowed = None if data["top_vocab"] is None else torch.tensor(data["top_vocab"], dtype=torch.long)
    slots = None  # vocabulary id -> column of the restricted output layer
    if allowed is not None:
        slots = torch.full((target.model.config.get_text_config().vocab_size,), -1, dtype=torch.long)
        slots[allowed] = torch.arange(allowed.shape[0])
    if data["kind"] == "model":
        shape = data.get("student", {})
        hidden, layers = shape.get("hidden_size", 0), shape.get("layers", 0)
        draft = narrow_draft(target.model, hidden, layers or 4, settings.seed) if hidden else draft_from_target(target.model, layers or 2)
        student = ModelStudent(draft, allowed)
    else:
        student = HeadStudent(new_head(target.model, settings.seed), target.model, allowed)
    return Trainer(student, [e for e in examples if not e.heldout], [e for e in examples if e.heldout], slots, pad,
                   settings.lr or DEFAULT_LR[data["kind"]], settings.batch_size, settings.seed,
                   ce_weight=1.0)


def _make_data(settings: JobSettings, target: LoadedModel, identity: dict, eos: set[int], pad: int, reporter: Reporter) -> dict:
    prompts = read_file(settings.prompts)
    train, held = split(prompts, settings.holdout, settings.seed)
    ordered = train + held
    context = getattr(target.model.config.get_text_config(), "max_position_embeddings", None)
    encoded = encode(target.tokenizer, ordered, settings.raw, context, settings.answers.max_new_tokens)
    answers = []
    for sampled in (False, True) if settings.answers.sampled else (False,):
        reporter.phase(f"target answers ({'sampled' if sampled else 'greedy'})", len(encoded))
        answers += answer(target.model, encoded, eos, pad, sampled, settings.answers, reporter.advance)
    sequences = [(ids + reply, len(ids)) for ids, reply in zip(encoded + encoded, answers) if reply]
    if not sequences:
        raise UserError("the target answered every prompt with nothing; there is nothing to learn from")
    heldout_flags = [i % len(encoded) >= len(train) for i, reply in enumerate(answers) if reply]
    reporter.phase("teacher pass", len(sequences))
    examples = teacher(target.model, sequences, settings.top_k, settings.kind == "head", settings.batch_size, pad,
                       reporter.advance)
    for example, held_out in zip(examples, heldout_flags):
        example.heldout = held_out
    vocab = target.model.config.get_text_config().vocab_size
    return {
        "kind": settings.kind, "target": identity, "seed": settings.seed, "student": _shape(settings),
        "top_k": settings.top_k, "prompts": str(settings.prompts),
        "heldout": [{"id": p.id, "prompt": p.text, **({"scenario": p.scenario} if p.scenario else {})} for p in held],
        "top_vocab": top_vocab(examples, settings.top_vocab, eos, vocab),
        "examples": [dict(vars(e)) for e in examples],
        "made": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _shape(settings: JobSettings) -> dict:
    return {"hidden_size": settings.hidden_size, "layers": settings.layers} if settings.kind == "model" else {}


def _reused_data(settings: JobSettings, target: LoadedModel, identity: dict, eos: set[int], pad: int, reporter: Reporter) -> dict:
    """Another run's answers (the dear part: generation), re-scored by a teacher pass if this kind
    needs what that run did not keep (a head needs the target's features)."""
    source = settings.data_from / "checkpoint" / "data.pt"
    if not source.is_file():
        raise UserError(f"--data-from {settings.data_from}: no checkpoint/data.pt there (it must be another train-draft --out)")
    data = load_checkpoint(source, DATA_KEYS)
    if data["target"]["fingerprint"] != identity["fingerprint"]:
        raise UserError(f"--data-from {settings.data_from}: its answers come from target {data['target']['source']}, not this one")
    examples = data["examples"]
    wants_features = settings.kind == "head"
    if wants_features and examples and examples[0].get("hidden") is None:
        reporter.phase("teacher pass", len(examples))
        rescored = teacher(target.model, [(e["ids"].tolist(), e["start"]) for e in examples], data["top_k"], True,
                           settings.batch_size, pad, reporter.advance)
        examples = [dict(vars(new), heldout=old["heldout"]) for new, old in zip(rescored, examples)]
    elif not wants_features:
        examples = [dict(e, hidden=None) for e in examples]
    vocab = target.model.config.get_text_config().vocab_size
    kept = [Example(**e) for e in examples]
    return {**data, "kind": settings.kind, "student": _shape(settings), "examples": examples,
            "top_vocab": top_vocab(kept, settings.top_vocab, eos, vocab), "reused_from": str(settings.data_from),
            "made": time.strftime("%Y-%m-%dT%H:%M:%S")}


def _resumed_data(data: dict, checkpoint: Path, settings: JobSettings, identity: dict) -> dict:
    if data["kind"] != settings.kind:
        raise UserError(f"the checkpoint in {checkpoint} trains a {data['kind']!r} drafter, not {settings.kind!r}")
    if data["target"]["fingerprint"] != identity["fingerprint"]:
        raise UserError(f"the checkpoint in {checkpoint} was made with target {data['target']['source']}, not this one")
    return data


def load_checkpoint(path: Path, keys: tuple[str, ...] = ()) -> dict:
    """A checkpoint file read as data only: tensors, numbers, strings and containers. Anyone can place a
    file in --out or --data-from, and a full unpickle would run whatever code it names; a file that is
    more than data is not one specdec wrote, and is refused unread."""
    try:
        data = torch.load(path, weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as exc:
        reason = first_line(exc)[:200]
        raise UserError(f"{path}: not a checkpoint specdec wrote ({reason}); it was not loaded: "
                        "remove it, or choose another --out") from None
    missing = [key for key in keys if key not in data] if isinstance(data, dict) else ["a mapping"]
    if missing:
        raise UserError(f"{path}: not a checkpoint specdec wrote (it lacks {', '.join(missing)}); "
                        "remove it, or choose another --out")
    return data


def _last_agreement(trainer: Trainer) -> float | None:
    return next((h["heldout_agreement"] for h in reversed(trainer.history) if "heldout_agreement" in h), None)


def _save(out: Path, kind: str, student, target: LoadedModel, meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if kind == "head":
        student.head.eval()
        save_head(out, student.head, {**meta, "layer": student.head.config_dict})
        return
    # bfloat16 halves the files; a draft only proposes, so its precision cannot change the output.
    student.model.eval().to(torch.bfloat16)
    student.model.save_pretrained(out)
    target.tokenizer.save_pretrained(out)
    write_meta(out, {**meta, "kind": "model"})
