"""The distillation loop for both drafter kinds, with a time or step budget and a resumable checkpoint.

A *student* is what gets trained: a small stand-alone LM made from the target's own parts, or a
draft head on the target's features. Both are scored the same way, soft cross-entropy to the
teacher's top-k (the head adds EAGLE's feature regression), and both report held-out greedy
agreement with the teacher, the top-1 match rate that approximates acceptance at K = 1.
"""

from __future__ import annotations

import copy
import math
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

from ..decoding.head_network import DraftHead, head_config, head_logits
from ..errors import UserError
from ..runtime.quantize import output_weight
from .distill import Batch, Example, collate, soft_cross_entropy

LAYER_KEY = re.compile(r"(^|\.)(layers|h|blocks)\.(\d+)\.")


def draft_from_target(target: PreTrainedModel, layers: int = 2) -> PreTrainedModel:
    """The target's class with ``layers`` of its layers (spread from first to last), its embedding,
    final norm and head copied: a start that already speaks the target's language."""
    config = copy.deepcopy(target.config)
    total = config.num_hidden_layers
    picks = sorted({round(i * (total - 1) / max(1, layers - 1)) for i in range(layers)})
    config.num_hidden_layers = len(picks)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in picks]
    draft = type(target)(config)
    state = {}
    for key, value in target.state_dict().items():
        match = LAYER_KEY.search(key)
        if match is None:
            state[key] = value
        elif int(match.group(3)) in picks:
            state[key[: match.start(3)] + str(picks.index(int(match.group(3)))) + key[match.end(3) :]] = value
    draft.load_state_dict(state, strict=False)
    return draft.to(target.dtype)


def narrow_draft(target: PreTrainedModel, hidden: int, layers: int = 4, seed: int = 0) -> PreTrainedModel:
    """A fresh model of the target's class, ``hidden`` wide: small enough to ship (the embedding is
    most of it). Its tied embedding starts as the target's projected onto its top ``hidden``
    principal directions, so that output layer already ranks tokens roughly as the target's does."""
    config = copy.deepcopy(target.config)
    text = config.get_text_config()
    if hidden >= text.hidden_size:
        raise UserError(f"--hidden-size must be below the target's width ({text.hidden_size}) to make it smaller, got {hidden}")
    head_dim = 64 if hidden % 64 == 0 else hidden // max(1, hidden // 64)
    heads = max(1, hidden // head_dim)
    ratio = text.num_attention_heads // max(1, getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
    text.hidden_size, text.head_dim, text.num_attention_heads = hidden, head_dim, heads
    text.num_key_value_heads = max(1, heads // max(1, ratio))
    text.intermediate_size = round(text.intermediate_size * hidden / target.config.get_text_config().hidden_size)
    text.num_hidden_layers = layers
    if getattr(text, "layer_types", None):
        text.layer_types = text.layer_types[:layers]
    text.tie_word_embeddings = True
    torch.manual_seed(seed)
    draft = type(target)(config)
    embedding = target.get_input_embeddings().weight.detach().float()
    _, _, directions = torch.linalg.svd(embedding, full_matrices=False)
    with torch.no_grad():
        draft.get_input_embeddings().weight.copy_(embedding @ directions[:hidden].T)
    draft.tie_weights()
    return draft.to(target.dtype)


class ModelStudent:
    """A stand-alone draft LM; its embedding and lm_head stay the target's (frozen)."""

    def __init__(self, draft: PreTrainedModel, allowed: torch.Tensor | None):
        self.model = draft.train()
        frozen = {id(draft.get_input_embeddings().weight), id(draft.get_output_embeddings().weight)}
        for parameter in draft.parameters():
            parameter.requires_grad_(id(parameter) not in frozen)
        self.out_weight = _rows(draft.get_output_embeddings().weight, allowed)

    def parameters(self):
        return [p for p in self.model.parameters() if p.requires_grad]

    def state(self) -> dict:
        return self.model.state_dict()

    def load(self, state: dict) -> None:
        self.model.load_state_dict(state)

    def logits(self, batch: Batch) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        hidden = self.model.base_model(batch.ids).last_hidden_state[batch.where]
        return [(head_logits(hidden, self.out_weight), None)]


class HeadStudent:
    """A DraftHead trained as it drafts (EAGLE-3's training-time test), unrolled ``unroll`` steps.

    Step 0 reads the target's true features at every position. Step ``a`` puts the head's own
    step-(a-1) guess at the newest position only, the one ``a`` tokens past each anchor: its
    queries attend to the anchor's true context (the step-0 keys up to the anchor, as the head's
    cache holds at inference) and to the anchor's own earlier unrolled positions, nothing else.
    Gradients flow through the whole unroll; step ``a``'s loss is weighted ``decay ** a``.
    ``columns`` picks the head's feature layers out of the data's (which may hold more).
    """

    def __init__(self, head: DraftHead, target: PreTrainedModel, allowed: torch.Tensor | None, unroll: int = 3,
                 noise: float = 0.0, decay: float = 0.8, columns: torch.Tensor | None = None, regression: float = 0.0):
        self.head, self.unroll, self.noise, self.decay = head.train(), unroll, noise, decay
        self.columns, self.regression = columns, regression
        self.embed = target.get_input_embeddings().weight.detach()
        self.out_weight = _rows(output_weight(target), allowed)

    def parameters(self):
        return list(self.head.parameters())

    def state(self) -> dict:
        return self.head.state_dict()

    def load(self, state: dict) -> None:
        self.head.load_state_dict(state)

    def logits(self, batch: Batch, steps: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor | None, float, torch.Tensor]]:
        """Per unrolled step: (logits at the teacher rows it reaches, regression or None, weight, which rows)."""
        steps = steps or (self.unroll if self.head.training else 1)
        raw = batch.hidden if self.columns is None else batch.hidden[..., self.columns]
        true = self.head.fused(raw)
        embeds = F.embedding(batch.ids, self.embed).float()
        previous = F.pad(true[:, :-1], (0, 0, 1, 0))  # position t reads the feature at t - 1
        if self.head.training and self.noise:  # robustness to imperfect features, as EAGLE does
            previous = previous + self.noise * true.detach().std() * torch.randn_like(previous)
        rows, positions = batch.where
        width = batch.ids.shape[1]
        at = torch.arange(width)[None].expand(batch.ids.shape[0], -1)
        cache = DynamicCache(config=self.head.config)
        outputs = []
        for step in range(steps):
            tokens = F.pad(embeds[:, step:], (0, 0, 0, step))  # anchor i reads token i + step
            guess = self.head(tokens, previous, cache, positions=at + step, mask=unroll_mask(width, step)[None, None])
            reached = positions >= step  # the teacher row of position p is anchor p - step's target
            picked = guess[rows[reached], positions[reached] - step]
            regression = None
            if self.regression:
                regression = self.regression * F.smooth_l1_loss(picked, true[rows[reached], positions[reached]])
            outputs.append((head_logits(picked, self.out_weight), regression, self.decay**step, reached))
            previous = guess  # the newest position of the next step reads this guess
        return outputs


def unroll_mask(width: int, step: int) -> torch.Tensor:
    """(width, (step + 1) * width) bool: which keys each anchor's query sees at unroll ``step``.

    Keys are laid out step by step; step 0's are the true positions (anchor i sees 0..i), each
    later step's hold one key per anchor, seen only by that same anchor.
    """
    blocks = [torch.ones(width, width, dtype=torch.bool).tril()]
    blocks += [torch.eye(width, dtype=torch.bool)] * step
    return torch.cat(blocks, dim=1)


def _steps(outputs: list[tuple]) -> list[tuple]:
    """A student's outputs as (logits, regression, weight, teacher rows): a model's single step reaches every row."""
    return [o if len(o) == 4 else (o[0], o[1], 1.0, slice(None)) for o in outputs]


def _rows(weight: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    return (weight if allowed is None else weight[allowed]).detach().float()


@dataclass
class Budget:
    steps: int | None = None  # total optimiser steps, counted across resumes
    minutes: float | None = None  # wall time for this run

    def done(self, step: int, started: float) -> bool:
        if self.steps is not None and step >= self.steps:
            return True
        return self.minutes is not None and time.monotonic() - started >= 60 * self.minutes


def learning_rate(peak: float, step: int, decay_steps: int, floor: float = 0.1) -> float:
    """Cosine from ``peak`` down to ``floor * peak`` over ``decay_steps``, then flat: a long run settles
    instead of hopping around a minimum at the peak rate. A function of the step alone, so a resumed run
    continues the schedule."""
    if decay_steps <= 0:
        return peak
    done = min(step, decay_steps) / decay_steps
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * done)))


@dataclass
class Trainer:
    student: ModelStudent | HeadStudent
    train: list[Example]
    heldout: list[Example]
    slots: torch.Tensor | None  # vocabulary id -> column of the restricted output layer, or None
    pad: int
    lr: float
    batch_size: int = 8
    seed: int = 0
    ce_weight: float = 1.0
    autocast: bool = False  # bfloat16 matmuls (several times faster where the CPU has AMX / AVX512-BF16)
    decay_steps: int = 0  # cosine decay of the learning rate to a tenth over this many steps (0: constant)
    step: int = 0
    history: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.optimizer = torch.optim.AdamW(self.student.parameters(), lr=self.lr, weight_decay=0.0)
        self.rng = random.Random(self.seed)

    def loss(self, batch: Batch) -> torch.Tensor:
        total = 0.0
        for logits, regression, weight, rows in _steps(self.student.logits(batch)):
            ce = soft_cross_entropy(logits, batch.top_ids[rows], batch.top_logp[rows], self.slots)
            total = total + weight * (self.ce_weight * ce + (0.0 if regression is None else regression))
        return total

    def run(self, budget: Budget, on_step: Callable[[int, float], None] | None = None,
            save: Callable[[], None] | None = None, eval_every: int = 50, save_every_s: float = 120.0) -> None:
        started = last_save = time.monotonic()
        while not budget.done(self.step, started):
            chosen = [self.train[self.rng.randrange(len(self.train))] for _ in range(self.batch_size)]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                loss = self.loss(collate(chosen, self.pad))
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rate(self.lr, self.step, self.decay_steps)
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.student.parameters(), 1.0)
            self.optimizer.step()
            self.step += 1
            self.history.append({"step": self.step, "loss": round(loss.item(), 4)})
            if self.step % eval_every == 0:
                self.history[-1]["heldout_agreement"] = self.agreement()
            if on_step:
                on_step(self.step, self.history[-1]["loss"])
            if save and time.monotonic() - last_save >= save_every_s:
                save()
                last_save = time.monotonic()

    @torch.no_grad()
    def agreement(self) -> float | None:
        """Held-out greedy top-1 agreement with the teacher (None without held-out data)."""
        chain = self.chain_agreement(1)
        return None if chain is None else chain[0]

    @torch.no_grad()
    def chain_agreement(self, steps: int = 1) -> list[float] | None:
        """Held-out top-1 agreement at each of ``steps`` draft positions, a head drafting on its own
        guesses after the first (the true tokens before it): what acceptance per position approximates."""
        if not self.heldout:
            return None
        head = isinstance(self.student, HeadStudent)
        module = self.student.head if head else self.student.model
        module.eval()
        hits, total = [0] * steps, [0] * steps
        for at in range(0, len(self.heldout), self.batch_size):
            batch = collate(self.heldout[at : at + self.batch_size], self.pad)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                outputs = self.student.logits(batch, steps) if head else self.student.logits(batch)
            for step, (logits, _, _, rows) in enumerate(_steps(outputs)):
                choice = logits.argmax(-1)
                if self.slots is not None:
                    choice = torch.nonzero(self.slots >= 0).flatten()[choice]
                hits[step] += int((choice == batch.top_ids[rows, 0]).sum())
                total[step] += choice.shape[0]
        module.train()
        return [round(h / max(t, 1), 4) for h, t in zip(hits, total)]

    def checkpoint(self) -> dict:
        return {"student": self.student.state(), "optimizer": self.optimizer.state_dict(), "step": self.step,
                "rng": self.rng.getstate(), "torch_rng": torch.get_rng_state(), "history": self.history}

    def restore(self, state: dict) -> None:
        self.student.load(state["student"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.step, self.history = state["step"], state["history"]
        self.rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])


def new_head(target: PreTrainedModel, seed: int) -> DraftHead:
    torch.manual_seed(seed)
    return DraftHead(head_config(target))


def save_atomically(obj, path: Path) -> None:
    """A checkpoint is written beside its final name and renamed, so an interrupt never leaves half a file."""
    staging = path.with_suffix(path.suffix + ".partial")
    torch.save(obj, staging)
    staging.replace(path)
