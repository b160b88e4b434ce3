"""The acceptance test of speculative decoding, as small pure functions.

Convention, kept everywhere in specdec: **p is the target's distribution, q is the draft's.**
The draft only proposes; every emitted token is judged by p:

- greedy: a draft token survives when it equals the target's argmax;
- sampling: a draft token survives when it equals the target's sampled token at its position, the
  winner of a race under noise fixed by the seed and the position (coupling.py); the scores are
  p / noise, and the test is greedy's on them. Each emitted token is distributed exactly as p, and
  the text depends on the seed, not on what drafted it.

The standard rule (``--accept standard``; Leviathan et al., Chen et al.) judges a chain on p and q
instead: x is kept with probability min(1, p(x)/q(x)), and at the first rejection the target's token
is drawn from norm(max(0, p − q)). Each emitted token is still distributed exactly as p, and more of
a draft model's guesses survive (Σ min(p, q) = 1 − TV against the race's ≥ (1 − TV)/(1 + TV)), but
its uniforms come from a generator whose draws follow the drafts: the seed fixes the text only for a
given drafter and K. It is lenient:1 of the lossy family below, and shares its code.

The opt-in lossy rules judge a chain on p and q too (min(1, p/q) made lenient, Medusa's typical
acceptance, top-N). A drafter that proposes deterministically (n-gram lookup) has a one-hot q; it
is passed as ``q=None`` rather than materialised (min(1, p/q) keeps its x with probability p(x)).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .rules import EXACT, LENIENT, STANDARD, TOP, TYPICAL, AcceptRule, parse_rule  # noqa: F401  (the rules' names live beside their math)


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
    """norm(max(0, p - q)): what the standard (or a lenient) rule's rejected position is resampled from.

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


# ---- Rules that judge a chain on p and q: the standard rule, and the relaxed (lossy) ones ---------
#
# Each lossy rule accepts some draft tokens the exact test would turn down, so the output is no longer
# the target's. They exist to measure what that costs (measure/lossy.py), not to be used unawares.
# After the first rejected draft the target's own token is drawn as under the standard rule.

def lenient_probability(p_x: torch.Tensor, q_x: torch.Tensor, lenience: float) -> torch.Tensor:
    """min(1, L·p(x) / q(x)): Leviathan et al.'s lenience; L = 1 is their exact test (the standard rule)."""
    return torch.clamp(lenience * p_x / q_x, max=1.0)


def lenient_verdict(
    p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor, lenience: float, uniforms: torch.Tensor
) -> tuple[int, torch.Tensor]:
    """min(1, L·p/q) on a sampled chain, given one uniform per draft token: how many drafts survive,
    and the distribution the target's token is drawn from (the residual norm(max(0, p − q)) at the
    first rejection, p's next row when every draft survives). Pure, so that a test can integrate it
    over the uniforms exactly; at L = 1 each emitted token is distributed as p.

    ``p`` has one row per draft token plus one; ``q`` one per draft token, or None (one-hot q)."""
    k = draft.shape[0]
    rows = torch.arange(k, device=p.device)
    q_x = torch.ones(k, device=p.device) if q is None else q[rows, draft]
    keep = uniforms.to(p.device) < lenient_probability(p[rows, draft], q_x, lenience)
    n = first_rejected(keep)
    if n == k:
        return n, p[n]
    return n, residual_distribution(p[n], _one_hot(draft[n], p.shape[-1], p) if q is None else q[n])


def first_rejected(keep: torch.Tensor) -> int:
    """The index of the first False in ``keep``, or its length: how many drafts a chain keeps."""
    rejected = (~keep).nonzero()
    return int(rejected[0, 0]) if rejected.numel() else keep.shape[0]


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
    """The verdict of a rule that judges a chain on p and q (the standard rule or a lossy one): how
    many draft tokens survive, and the token the target adds.

    The standard rule under greedy decoding is the exact test itself (``greedy_accept`` on the logits).
    For the lossy rules under greedy p is the softmax of the raw logits (temperature 1), which they need
    to see how likely a token is; lenient then keeps x when L·p(x) ≥ max p, and the target's token
    after a rejection is its argmax. Under sampling p is the warped distribution, and the target's
    token is drawn from the residual (standard, lenient) or, for the other rules, from p itself.
    """
    if rule.kind == STANDARD and sampling.greedy:
        return greedy_accept(draft, logits)
    k = draft.shape[0]
    p = torch.softmax(logits.float(), dim=-1) if sampling.greedy else distribution(logits, sampling)
    q = None if q is None else q.to(p)
    rows = torch.arange(k, device=p.device)
    if rule.kind in (STANDARD, LENIENT):
        lenience = rule.params[0] if rule.kind == LENIENT else 1.0
        if not sampling.greedy:
            n, after = lenient_verdict(p, q, draft, lenience, torch.rand(k, generator=generator, device=p.device))
            return n, _sample(after, generator)
        keep = lenience * p[rows, draft] >= p[:k].max(-1).values
    elif rule.kind == TYPICAL:
        keep = typical_keep(p[:k], draft, *rule.params)
    elif rule.kind == TOP:
        keep = top_keep(p[:k], draft, int(rule.params[0]))
    else:
        raise ValueError(f"not a rule that reads p and q: {rule}")
    n = first_rejected(keep)
    return n, int(p[n].argmax()) if sampling.greedy else _sample(p[n], generator)
