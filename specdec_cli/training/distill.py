"""Training data for a drafter: the target answers the prompts, and a teacher pass keeps what the loss needs.

A drafter is good when it predicts what *this* target writes, so the data are the target's own
answers (greedy, which the greedy loop will verify, and sampled, for variety), not human text. The
teacher pass stores, per answer position, the target's top-k log-probabilities (enough for a soft
cross-entropy; the full 50k-wide rows would not fit in memory) and, for a draft head, the target's
last hidden state at every position.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedModel

from ..errors import UserError
from ..decoding.kv import input_device
from ..runtime.quantize import dense_kernels
from ..pairs.tokenization import encode_prompt
from ..prompts import Prompt


def default_target():
    """The default pair's target (at its configured dtype), its end-of-sequence ids and a pad id."""
    from ..pairs.loading import load
    from ..pairs.registry import load_registry
    from ..pairs.tokenization import eos_ids

    target = load(load_registry(None).pair(None).target)
    eos = eos_ids(target.tokenizer, target.model.generation_config)
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else min(eos)
    return target, eos, pad

@dataclass
class Example:
    """One prompt + answer. Row j of ``top_ids``/``top_logp`` is the teacher at position ``start - 1 + j``,
    predicting token ``ids[start + j]``; ``hidden`` (head only) holds the target's features at every position."""

    ids: torch.Tensor
    start: int
    top_ids: torch.Tensor
    top_logp: torch.Tensor
    hidden: torch.Tensor | None = None
    heldout: bool = False


@dataclass
class AnswerSettings:
    max_new_tokens: int = 128
    temperature: float = 0.8  # for the sampled answers; a greedy answer is always made too
    batch_size: int = 8
    seed: int = 0
    sampled: bool = True  # a sampled answer besides the greedy one (more text per prompt, less variety)


def split(prompts: list[Prompt], fraction: float, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """(train, held out): a seeded shuffle, at least one prompt held out when there are two or more."""
    if len(prompts) < 2:
        raise UserError("train-draft needs at least two prompts (one is held out to measure acceptance)")
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    held = min(len(prompts) - 1, max(1, round(fraction * len(prompts))))
    chosen = set(order[:held])
    return [p for i, p in enumerate(prompts) if i not in chosen], [p for i, p in enumerate(prompts) if i in chosen]


@torch.inference_mode()
def answer(target: PreTrainedModel, prompts: list[list[int]], eos: set[int], pad: int, sampled: bool,
           settings: AnswerSettings, progress=None) -> list[list[int]]:
    """The target's answers, batched with left padding (so every row continues at the same place)."""
    device = input_device(target)
    options = {"do_sample": True, "temperature": settings.temperature, "top_k": 0, "top_p": 1.0} if sampled else {"do_sample": False}
    answers = []
    torch.manual_seed(settings.seed)
    for at in range(0, len(prompts), settings.batch_size):
        batch = prompts[at : at + settings.batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        out = target.generate(ids, attention_mask=mask, max_new_tokens=settings.max_new_tokens, pad_token_id=pad,
                              eos_token_id=sorted(eos), **options)
        for row in out[:, width:].tolist():
            ends = [i for i, token in enumerate(row) if token in eos]
            answers.append(row[: ends[0] + 1] if ends else row)
        if progress:
            progress(len(batch))
    return answers


@torch.inference_mode()
def answer_pruned(target: PreTrainedModel, prompts: list[list[int]], eos: set[int], pad: int, sampled: bool,
                  settings: AnswerSettings) -> list[list[int]]:
    """``answer`` for one batch, with finished rows dropped from the batch (and its KV cache) as
    they end: a batch then costs its answers' tokens, not its longest answer times its rows."""
    device = input_device(target)
    vocab = target.config.get_text_config().vocab_size
    generator = torch.Generator(device=device).manual_seed(settings.seed)
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=target.config)
    logits = target(ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1).logits
    rows, following = torch.arange(len(prompts)), positions[:, -1] + 1
    alive = torch.ones(len(prompts), dtype=torch.bool)
    answers: list[list[int]] = [[] for _ in prompts]
    for step in range(settings.max_new_tokens):
        scores = logits[:, -1, :vocab].float()
        if sampled:
            token = torch.multinomial(torch.softmax(scores / settings.temperature, -1), 1, generator=generator)[:, 0]
        else:
            token = scores.argmax(-1)
        for i, (row, value) in enumerate(zip(rows.tolist(), token.tolist())):
            if alive[i]:
                answers[row].append(value)
                alive[i] = value not in eos
        if step == settings.max_new_tokens - 1 or not alive.any():
            break
        kept = alive.nonzero().flatten()
        if kept.numel() == 1 and len(prompts) > 1:
            # A lone left-padded row would take the one-query attention path, which assumes no
            # padding: a finished row stays along (its tokens are not kept) to keep the batch at two.
            kept = torch.cat([kept, (~alive).nonzero().flatten()[:1]])
        if kept.numel() < alive.shape[0]:
            cache.batch_select_indices(kept.to(device))
            rows, mask, token, following, alive = rows[kept], mask[kept], token[kept], following[kept], alive[kept]
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        logits = target(token[:, None], attention_mask=mask, position_ids=following[:, None], cache=cache, use_cache=True).logits
        following = following + 1
    return answers


@torch.inference_mode()
def teacher(target: PreTrainedModel, sequences: list[tuple[list[int], int]], top_k: int, features: bool,
            batch_size: int, pad: int, progress=None, layers: tuple[int, ...] = (-1,)) -> list[Example]:
    """Top-k log-probs at each answer position (and, for a head, the hidden states ``layers`` select,
    concatenated, at every position), right-padded batches."""
    device = input_device(target)
    vocab = target.config.get_text_config().vocab_size
    examples = []
    with dense_kernels(target):
        for at in range(0, len(sequences), batch_size):
            batch = sequences[at : at + batch_size]
            examples += _scored(target, batch, top_k, features, pad, layers, vocab, device)
            if progress:
                progress(len(batch))
    return examples


def _scored(target, batch, top_k, features, pad, layers, vocab, device) -> list[Example]:
    """One right-padded batch through the target: its examples, in order."""
    examples = []
    width = max(len(ids) for ids, _ in batch)
    ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in batch], device=device)
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in batch], device=device)
    out = target(ids, attention_mask=mask, **({"output_hidden_states": list(layers)} if features else {}))
    for row, (tokens, start) in enumerate(batch):
        logp = F.log_softmax(out.logits[row, start - 1 : len(tokens) - 1, :vocab].float(), dim=-1)
        top = logp.topk(min(top_k, vocab), dim=-1)
        hidden = torch.cat([out.hidden_states[i][row, : len(tokens)] for i in layers], -1).float().cpu() if features else None
        examples.append(Example(torch.tensor(tokens), start, top.indices.int().cpu(), top.values.cpu(), hidden))
    return examples


def encode(tokenizer, prompts: list[Prompt], raw: bool, context: int | None, room: int) -> list[list[int]]:
    encoded = [encode_prompt(tokenizer, p.text, raw) for p in prompts]
    if context:
        too_long = [p.id for p, ids in zip(prompts, encoded) if len(ids) + room > context]
        if too_long:
            raise UserError(f"prompt {too_long[0]} leaves no room for a {room}-token answer in the target's {context}-token context")
    return encoded


def top_vocab(examples: list[Example], size: int, eos: set[int], vocab: int) -> list[int] | None:
    """The ``size`` ids the target writes most often in its training answers (EOS always included)."""
    if size <= 0 or size >= vocab:
        return None
    counts = Counter()
    for example in examples:
        if not example.heldout:
            counts.update(example.ids[example.start :].tolist())
    chosen = sorted(eos)[:size]
    for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if len(chosen) >= size:
            break
        if token not in chosen:
            chosen.append(token)
    return sorted(chosen)


@dataclass
class Batch:
    """Right-padded examples: ``where`` picks the (row, position) pairs that carry a teacher row."""

    ids: torch.Tensor
    where: tuple[torch.Tensor, torch.Tensor]
    top_ids: torch.Tensor
    top_logp: torch.Tensor
    hidden: torch.Tensor | None


def collate(examples: list[Example], pad: int) -> Batch:
    width = max(e.ids.shape[0] for e in examples)
    ids = torch.full((len(examples), width), pad, dtype=torch.long)
    rows, positions = [], []
    for i, e in enumerate(examples):
        ids[i, : e.ids.shape[0]] = e.ids
        span = torch.arange(e.start - 1, e.ids.shape[0] - 1)
        rows.append(torch.full_like(span, i))
        positions.append(span)
    hidden = None
    if examples[0].hidden is not None:
        hidden = torch.zeros(len(examples), width, examples[0].hidden.shape[1])
        for i, e in enumerate(examples):
            hidden[i, : e.hidden.shape[0]] = e.hidden.float()  # kept in bfloat16 by a large corpus
    return Batch(ids, (torch.cat(rows), torch.cat(positions)), torch.cat([e.top_ids for e in examples]).long(),
                 torch.cat([e.top_logp for e in examples]), hidden)


def soft_cross_entropy(logits: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor, slots: torch.Tensor | None) -> torch.Tensor:
    """Cross-entropy of the draft against the teacher's top-k, renormalised to the ids the draft can emit.

    ``slots`` maps a vocabulary id to its column in a restricted output layer (-1: not in it);
    teacher mass on ids outside the layer is dropped, as the draft can never propose them.
    """
    columns = top_ids if slots is None else slots[top_ids]
    valid = columns >= 0
    weights = torch.softmax(top_logp.masked_fill(~valid, float("-inf")), dim=-1).nan_to_num(0.0)
    logq = torch.log_softmax(logits.float(), dim=-1).gather(1, columns.clamp(min=0))
    per_row = -(weights * logq).masked_fill(~valid, 0.0).sum(-1)
    keep = valid.any(-1)
    return per_row[keep].mean() if keep.any() else logits.sum() * 0.0
