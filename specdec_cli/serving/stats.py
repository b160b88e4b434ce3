"""The engine figures as small pure functions: latency percentiles, acceptance from the server's
counters, the speculative gain with its interval, the crossover concurrency, and the per-batch-size
K table in vLLM's own format. Nothing here does I/O."""

from __future__ import annotations

import math
import statistics

import numpy as np

# Two-sided 95 % Student t quantiles by degrees of freedom (scipy is a test extra only).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       15: 2.131, 20: 2.086, 30: 2.042}


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (q in 0..100) as `vllm bench serve` computes it: ``np.percentile``'s default,
    linear interpolation between the two closest ranks (rank (n - 1) * q / 100). The one definition in
    every report, the engine bench's and this loop's alike, so that a p90 means the same in both; None
    for no values."""
    return float(np.percentile(values, q)) if values else None


def latency_summary(values_s: list[float], percentiles=(50, 90, 99)) -> dict[str, float | None]:
    """Mean and percentiles in milliseconds, the unit `vllm bench serve` prints."""
    out = {"mean_ms": round(statistics.fmean(values_s) * 1000, 3) if values_s else None}
    for q in percentiles:
        value = percentile(values_s, q)
        out[f"p{q}_ms"] = None if value is None else round(value * 1000, 3)
    return out


def acceptance(drafts: float, draft_tokens: float, accepted: float, per_position: list[float]) -> dict:
    """What the counters say over a window. acceptance_rate = accepted / drafted;
    mean_acceptance_length = 1 + accepted / drafts (vLLM's: the bonus token counted);
    per_position[i] = share of drafts whose token i was accepted; α = accepted / judged, where the
    drafts judged at position i are those whose first i tokens were accepted (this project's α)."""
    if drafts <= 0:
        return {"drafts": 0, "draft_tokens": int(draft_tokens), "accepted": int(accepted), "acceptance_rate": None,
                "alpha": None, "mean_acceptance_length": None, "per_position": []}
    judged = drafts + sum(per_position[:-1])
    return {
        "drafts": int(drafts), "draft_tokens": int(draft_tokens), "accepted": int(accepted),
        "acceptance_rate": round(accepted / draft_tokens, 4) if draft_tokens else None,
        "alpha": round(accepted / judged, 4) if judged else None,
        "mean_acceptance_length": round(1 + accepted / drafts, 4),
        "per_position": [round(count / drafts, 4) for count in per_position],
    }


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile: linear inside the bucket that holds the q-quantile
    (``buckets`` = cumulative (upper bound, count), +Inf last); the highest finite bound past it."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def gain(speculative: list[float], plain: list[float]) -> dict:
    """Speculative over plain throughput: the ratio of means, and a 95 % t interval on the per-repeat
    ratios when there are at least two paired repeats (None otherwise)."""
    if not speculative or not plain or statistics.fmean(plain) <= 0:
        return {"gain": None, "low": None, "high": None, "repeats": 0}
    point = statistics.fmean(speculative) / statistics.fmean(plain)
    ratios = [s / p for s, p in zip(speculative, plain) if p > 0]
    if len(ratios) < 2:
        return {"gain": round(point, 4), "low": None, "high": None, "repeats": len(ratios)}
    df = len(ratios) - 1
    t = T95.get(df) or T95[max(k for k in T95 if k <= df)]
    half = t * statistics.stdev(ratios) / math.sqrt(len(ratios))
    return {"gain": round(point, 4), "low": round(point - half, 4), "high": round(point + half, 4), "repeats": len(ratios)}


def crossover(levels: list[int], gains: list[float | None]) -> float | None:
    """The concurrency where the gain first falls below 1, interpolated linearly between the two
    levels around it; the first level itself if it is already below; None if it never falls."""
    previous = None
    for level, value in zip(levels, gains):
        if value is None:
            continue
        if value < 1.0:
            if previous is None:
                return float(level)
            (level0, value0) = previous
            return round(level0 + (level - level0) * (value0 - 1.0) / (value0 - value), 3)
        previous = (level, value)
    return None


def k_table(levels: list[int], gains_by_k: dict[int, list[float | None]]) -> list[list[int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size``: ``[[first_bs, last_bs, K], ...]``, the K
    with the best gain (above 1) at each measured concurrency, 0 where none pays; each level's K holds
    from it up to the batch size before the next level, the last up to itself; equal neighbours merge."""
    rows: list[list[int]] = []
    for index, level in enumerate(levels):
        best, best_gain = 0, 1.0
        for k, gains in sorted(gains_by_k.items()):
            value = gains[index]
            if value is not None and value > best_gain:
                best, best_gain = k, value
        last = levels[index + 1] - 1 if index + 1 < len(levels) else level
        first = 1 if index == 0 else level
        if rows and rows[-1][2] == best:
            rows[-1][1] = last
        else:
            rows.append([first, last, best])
    return rows


def goodput(requests: list[dict], slos_ms: dict[str, float], window_s: float) -> float | None:
    """Requests per second that met every SLO (ttft, tpot, e2el in ms), as `vllm bench serve --goodput`."""
    if not slos_ms or window_s <= 0:
        return None
    good = sum(1 for r in requests if not r.get("error") and all(
        r.get(f"{name}_ms") is not None and r[f"{name}_ms"] <= limit for name, limit in slos_ms.items()))
    return round(good / window_s, 4)
