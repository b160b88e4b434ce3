"""Greedy token ids of a speculative server against a plain one, prompt by prompt: where they first
differ, and whether the plain server's own top-2 logprob margin there is within round-off (a
near-tie: batch shape and verify blocks change float sums) or not (a real divergence)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .client import Completion, Endpoint, complete

NEAR_TIE, REAL = "near-tie", "divergence"


@dataclass(frozen=True)
class EngineDivergence:
    prompt_id: str
    position: int  # index into the generated tokens
    reference_token: int | None
    speculative_token: int | None
    margin: float | None  # the reference's top-1 minus top-2 logprob there
    kind: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def top2_margin(top: dict[str, float]) -> float | None:
    values = sorted(top.values(), reverse=True)
    return values[0] - values[1] if len(values) >= 2 else None


def token_of(key: str) -> int | None:
    """'token_id:123' (vLLM's return_tokens_as_token_ids) → 123."""
    return int(key.split(":", 1)[1]) if key.startswith("token_id:") else None


def first_divergence(prompt_id: str, reference: Completion, speculative: Completion, tolerance: float) -> EngineDivergence | None:
    """None when the two token id lists are equal; else the first position they differ at, classified."""
    ref, spec = reference.token_ids, speculative.token_ids
    if ref == spec:
        return None
    position = next((i for i, (a, b) in enumerate(zip(ref, spec)) if a != b), min(len(ref), len(spec)))
    ref_token = ref[position] if position < len(ref) else None
    spec_token = spec[position] if position < len(spec) else None
    top = reference.top_logprobs[position] if position < len(reference.top_logprobs) else {}
    margin = top2_margin(top)
    in_top2 = spec_token in {token_of(k) for k in sorted(top, key=top.get, reverse=True)[:2]}
    near = margin is not None and margin <= tolerance and in_top2
    return EngineDivergence(prompt_id, position, ref_token, spec_token, None if margin is None else round(margin, 6),
                      NEAR_TIE if near else REAL)


def generate_all(endpoint: Endpoint, prompts: list[tuple[str, list[int]]], max_tokens: int, concurrency: int,
                 logprobs: int | None = None, timeout_s: float = 120.0) -> list[Completion]:
    """Every prompt once, greedily, ``concurrency`` in flight; order kept."""
    def one(item):
        return complete(endpoint, item[1], max_tokens, logprobs=logprobs, timeout_s=timeout_s)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, prompts))


def compare(prompts: list[tuple[str, list[int]]], reference: list[Completion], speculative: list[Completion],
            tolerance: float) -> dict:
    """Counts and divergences of one level; failed requests are named, never taken as equal."""
    failed = [pid for (pid, _), r, s in zip(prompts, reference, speculative) if r.error or s.error]
    divergences = [d for (pid, _), r, s in zip(prompts, reference, speculative)
                   if pid not in failed and (d := first_divergence(pid, r, s, tolerance))]
    return {"prompts": len(prompts), "identical": len(prompts) - len(failed) - len(divergences), "failed": failed,
            "near_ties": sum(d.kind == NEAR_TIE for d in divergences),
            "divergences": sum(d.kind == REAL for d in divergences), "details": [d.as_dict() for d in divergences]}
