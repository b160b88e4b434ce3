"""The acceptance test of speculative decoding, as small pure functions.

Convention, kept everywhere in specdec: **p is the target's distribution, q is the draft's.**
The draft only proposes; every emitted token is judged by p:

- greedy: a draft token survives when it equals the target's argmax;
- sampling: a draft token survives when it equals the target's sampled token at its position, the
  winner of a race under noise fixed by the seed and the position (coupling.py); the scores are
  p / noise, and the test is greedy's on them. Each emitted token is distributed exactly as p, and
  the text depends on the seed, not on what drafted it.

The opt-in lossy rules below judge a chain on p and q (Leviathan et al.'s min(1, p/q) made
lenient, Medusa's typical acceptance, top-N). A drafter that proposes deterministically (n-gram
lookup) has a one-hot q; it is passed as ``q=None`` rather than materialised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .rules import EXACT, LENIENT, TOP, TYPICAL, AcceptRule, parse_rule  # noqa: F401  (the rules' names live beside their math)


if TYPE_CHECKING:
    from transformers.generation.logits_process import LogitsProcessorList


@dataclass(frozen=True)
class SamplingParams:
    """Temperature 0 means greedy; top-k 0 and top-p 1 mean no truncation."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    warpers: LogitsProcessorList | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        # Built with the parameters, so that a run that warps imports transformers' logits processors
        # before it starts rather than in its first round, and one that does not (greedy) never does.
        warps = self.temperature not in (0.0, 1.0) or self.top_k > 0 or self.top_p < 1.0
        object.__setattr__(self, "warpers", sampling_warpers(self) if warps else None)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def sampling_warpers(params: SamplingParams) -> LogitsProcessorList:
    """transformers' own warpers, in the order `generate` applies them, so that a sampled
    continuation here means the same as one from `generate(do_sample=True, ...)`."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers = LogitsProcessorList()
    if params.temperature not in (0.0, 1.0):
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(params.top_p))
    return warpers


def distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Rows of logits → rows of probabilities after temperature, top-k and top-p.

    Applied identically to the target's and the draft's logits, before the acceptance test.
    """
    rows = logits.reshape(-1, logits.shape[-1]).float()
    warped = rows if params.warpers is None else params.warpers(None, rows)
    return torch.softmax(warped, dim=-1).reshape(logits.shape)


def greedy_accept(draft: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Longest prefix of ``draft`` that equals the target's argmax, and the target's next token.

    ``target_logits`` has one row per draft token plus one: row i scores the position of draft[i].
    Under sampling the rows are the race's scores (coupling.py), whose argmax is the sampled token.
    """
    choice = target_logits.argmax(dim=-1)
    k = draft.shape[0]
    n = int((draft == choice[:k]).to(torch.int64).cumprod(0).sum()) if k else 0
    return n, int(choice[n])


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): what a lenient rule's rejected position is resampled from.

    If p ≤ q everywhere the draft token could not have been rejected; p is returned then so
    that float round-off never leaves an all-zero row to sample from.
    """
    residual = torch.clamp(p - q, min=0.0)
    total = residual.sum()
    return residual / total if total > 0 else p


def _one_hot(token: torch.Tensor, size: int, like: torch.Tensor) -> torch.Tensor:
    row = torch.zeros(size, dtype=like.dtype, device=like.device)
    row[token] = 1.0
    return row


def _sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


# ---- Relaxed (lossy) rules: opt-in only, never a default -------------------------------------------
#
# Each accepts some draft tokens the exact test would turn down, so the output is no longer the
# target's. They exist to measure what that costs (measure/lossy.py), not to be used unawares.
# After the first rejected draft the target's own token is drawn as under the exact test.

def lenient_probability(p_x: torch.Tensor, q_x: torch.Tensor, lenience: float) -> torch.Tensor:
    """min(1, L·p(x) / q(x)): Leviathan et al.'s lenience; L = 1 is their exact test."""
    return torch.clamp(lenience * p_x / q_x, max=1.0)


def typical_keep(p: torch.Tensor, draft: torch.Tensor, eps: float, delta: float) -> torch.Tensor:
    """Medusa's typical acceptance: keep x when p(x) > min(EPS, DELTA·exp(−H(p))), row by row.

    The target's most likely token is always kept, as in Medusa, so greedy output stays reachable.
    """
    rows = torch.arange(draft.shape[0], device=p.device)
    entropy = -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
    threshold = torch.clamp(delta * torch.exp(-entropy), max=eps)
    return (p[rows, draft] > threshold) | (draft == p.argmax(-1))


def top_keep(p: torch.Tensor, draft: torch.Tensor, n: int) -> torch.Tensor:
    """Keep x when it is among the target's N most likely tokens, row by row."""
    top = p.topk(min(n, p.shape[-1]), dim=-1).indices
    return (top == draft[:, None]).any(-1)


def relaxed_accept(
    rule: AcceptRule,
    draft: torch.Tensor,
    q: torch.Tensor | None,
    logits: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """A lossy rule's verdict: how many draft tokens survive, and the token the target adds.

    Under greedy decoding p is the softmax of the raw logits (temperature 1), which the rules need to
    see how likely a token is; lenient then keeps x when L·p(x) ≥ max p, and the target's token
    after a rejection is its argmax. Under sampling p is the warped distribution, and the target's
    token is drawn from the lenient residual or, for the other rules, from p itself.
    """
    k = draft.shape[0]
    p = torch.softmax(logits.float(), dim=-1) if sampling.greedy else distribution(logits, sampling)
    q = None if q is None else q.to(p)
    rows = torch.arange(k, device=p.device)
    if rule.kind == LENIENT:
        lenience = rule.params[0]
        if sampling.greedy:
            keep = lenience * p[rows, draft] >= p[:k].max(-1).values
        else:
            q_x = torch.ones(k, device=p.device) if q is None else q[rows, draft]
            u = torch.rand(k, generator=generator, device=p.device)
            keep = u < lenient_probability(p[rows, draft], q_x, lenience)
    elif rule.kind == TYPICAL:
        keep = typical_keep(p[:k], draft, *rule.params)
    elif rule.kind == TOP:
        keep = top_keep(p[:k], draft, int(rule.params[0]))
    else:
        raise ValueError(f"not a relaxed rule: {rule}")
    rejected = (~keep).nonzero()
    n = int(rejected[0, 0]) if rejected.numel() else k
    if sampling.greedy:
        return n, int(p[n].argmax())
    if n < k and rule.kind == LENIENT:
        q_n = _one_hot(draft[n], p.shape[-1], p) if q is None else q[n]
        return n, _sample(residual_distribution(p[n], q_n), generator)
    return n, _sample(p[n], generator)
