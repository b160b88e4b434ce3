"""The verdict of verify-equivalence over its two halves: greedy (equivalence.py) and sampled
(sampling_check.py)."""

from __future__ import annotations

from ..decoding.acceptance import AcceptRule
from .equivalence import MISMATCH, NEAR_TIE, GreedyResult
from .sampling_check import SamplingResult


def decide(greedy: GreedyResult, sampled: SamplingResult | None, strict: bool, rule: AcceptRule = AcceptRule()) -> tuple[bool, str]:
    """Equivalent unless a mismatch, a failed sampling test, or (strict) any divergence was found;
    never under a lossy rule, which is not equivalent by construction however few tokens it changed."""
    mismatches, near_ties = greedy.count(MISMATCH), greedy.count(NEAR_TIE)
    sampled_failed = sampled is not None and (not sampled.passed or (strict and sampled.count(NEAR_TIE) > 0))
    failed = mismatches > 0 or (strict and near_ties > 0) or sampled_failed
    runs = len(greedy.rows)
    identical = sum(r.identical for r in greedy.rows)
    reference = sum(r.identical for r in greedy.references)
    parts = [f"{identical}/{runs} speculative runs token-identical to plain decoding",
             f"{reference}/{len(greedy.references)} plain runs identical to transformers' generate",
             f"{mismatches} mismatch(es)", f"{near_ties} numerical near-tie(s) (tolerance {greedy.tolerance:g})"]
    if strict and near_ties:
        parts.append("--strict counts near-ties as failures")
    if sampled is not None:
        parts.append(f"sampling: {sampled.verdict()}")
    if not rule.lossless:
        return False, f"NOT EQUIVALENT: lossy rule --accept {rule} (lossless: false); " + "; ".join(parts)
    return not failed, ("EQUIVALENT: " if not failed else "NOT EQUIVALENT: ") + "; ".join(parts)
