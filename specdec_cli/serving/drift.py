"""Is a running server still doing what its export recommends, and is its traffic still the traffic
it was calibrated on? Pure functions of the exported speculative config, the profile's α and the
server's counters over a window (nothing here reads a file or the network).

α is this project's per-token acceptance on both sides: accepted drafts over drafts the target
judged (a draft after the first rejection of its round is never judged). calibrate-k writes it so
(measure/calibration.py, ``Tally.alpha``) and stats.acceptance computes it so from vLLM's counters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import metrics
from ..pairs.profile import k_values
from .metrics import Snapshot

MIN_DRAFT_TOKENS = 100  # fewer drafted tokens in the window: too few to judge drift (100 judged give α about ±0.1)
K_SLACK = 0.5  # a measured mean K this close to the recommendation agrees (n-gram drafts run short near a text's end)
Z95 = 1.959964  # two-sided 95 % normal quantile
INSIDE, ABOVE, BELOW, TOO_FEW, NO_PROFILE = "inside", "above", "below", "too few drafts to tell", "no profile"
RECALIBRATE = ("recalibrate on recent traffic (specdec calibrate-k --prompts RECENT.jsonl --write), then "
               "export again (specdec export --engine vllm ...)")


@dataclass(frozen=True)
class Schedule:
    """What a vLLM export asks the server to draft: K at start-up, and the per-batch-size table."""

    k: int  # num_speculative_tokens (0: the export serves without speculation)
    table: tuple[tuple[int, int, int], ...] = ()  # (first_bs, last_bs, K), inclusive, sorted
    method: str | None = None


def schedule_from(data) -> Schedule:
    """The schedule in `specdec export --engine vllm --json` output or in its --out file (vLLM's
    --speculative-config object; {} when no K pays). ValueError says why anything else is not one."""
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    if "speculative_config" in data or "engine" in data:
        if data.get("engine") != "vllm":
            raise ValueError(f"exported for {data.get('engine')!r}; watch compares a vLLM export (--engine vllm)")
        data = data.get("speculative_config") or {}
        if not isinstance(data, dict):
            raise ValueError("its speculative_config is not an object")
    if not data:
        return Schedule(0)
    if "method" not in data or not isinstance(data.get("num_speculative_tokens"), int) or data["num_speculative_tokens"] < 0:
        raise ValueError("not vLLM's --speculative-config: it needs a method and a num_speculative_tokens of 0 or more")
    return Schedule(data["num_speculative_tokens"], _table(data.get("num_speculative_tokens_per_batch_size")),
                    str(data["method"]))


def _table(rows) -> tuple[tuple[int, int, int], ...]:
    """vLLM's own checks of the table (v1/spec_decode/dynamic/utils.py): what it refuses, we refuse."""
    if rows is None:
        return ()
    if not isinstance(rows, list) or not rows:
        raise ValueError("num_speculative_tokens_per_batch_size must be a non-empty list of [first_bs, last_bs, K]")
    parsed = []
    for row in rows:
        if not isinstance(row, list) or len(row) != 3 or not all(isinstance(v, int) for v in row):
            raise ValueError(f"num_speculative_tokens_per_batch_size row {row!r} is not [first_bs, last_bs, K]")
        if row[0] <= 0 or row[0] > row[1] or row[2] < 0:
            raise ValueError(f"num_speculative_tokens_per_batch_size row {row!r}: needs 0 < first_bs <= last_bs and K >= 0")
        parsed.append(tuple(row))
    parsed.sort()
    if parsed[0][0] != 1 or any(b[0] <= a[1] for a, b in zip(parsed, parsed[1:])):
        raise ValueError("num_speculative_tokens_per_batch_size ranges must start at 1 and not overlap")
    return tuple(parsed)


def recommended_k(schedule: Schedule, running: int) -> tuple[int, str]:
    """The K vLLM's scheduler takes at this many running requests (at least one) and where it came
    from. As vLLM expands the table: a gap keeps the previous row's K, past the last row the last
    K holds, and no row's K exceeds num_speculative_tokens."""
    batch = max(running, 1)
    if not schedule.table:
        return schedule.k, "num_speculative_tokens"
    chosen = schedule.table[0]
    for row in schedule.table:
        if row[0] > batch:
            break
        chosen = row
    where = "row" if chosen[0] <= batch <= chosen[1] else "gap after row" if chosen is not schedule.table[-1] else "past row"
    return min(chosen[2], schedule.k), f"table {where} {list(chosen)}"


def measured_k(drafts: float, draft_tokens: float, generated: float) -> float | None:
    """Tokens drafted per draft from the counters; 0 when tokens were generated but none drafted;
    None when the server generated nothing (an idle server drafts nothing whatever its K)."""
    if drafts > 0:
        return draft_tokens / drafts
    return 0.0 if generated > 0 else None


def k_agrees(recommended: int, measured: float | None) -> bool | None:
    return None if measured is None else abs(measured - recommended) <= K_SLACK


def wilson(successes: float, trials: float, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a proportion; (0, 1) with no trials."""
    if trials <= 0:
        return 0.0, 1.0
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z / (1 + z * z / trials) * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    return max(0.0, centre - half), min(1.0, centre + half)


def judged_per_token(alpha: float, k: int) -> float:
    """Drafts judged per generated token in chains of K at a per-token acceptance α: a round judges
    (1-α^K)/(1-α) drafts and yields (1-α^(K+1))/(1-α) tokens (K/(K+1) at α = 1)."""
    if alpha >= 1.0:
        return k / (k + 1)
    return (1 - alpha ** k) / (1 - alpha ** (k + 1))


def _measured(text) -> list[int]:
    """The Ks a profile says calibrate-k measured; [] when it says none it can be read for."""
    try:
        return k_values(text) if text is not None else []
    except ValueError:
        return []


@dataclass(frozen=True)
class Band:
    """The profile's α and its 95 % interval. The profile keeps no count of judged drafts, so the
    count is estimated from what it keeps (prompts, tokens per prompt, the Ks measured): every K > 0
    ran every prompt to max_new_tokens, an upper bound when prompts end early (so a narrower
    interval). Without those settings the interval is the point itself."""

    alpha: float
    low: float
    high: float
    judged: int | None


def profile_band(alpha: float, prompt_count=None, max_new_tokens=None, ks=None) -> Band:
    try:
        tokens = int(prompt_count) * int(max_new_tokens)
    except (TypeError, ValueError):
        tokens = 0
    drafting = [k for k in _measured(ks) if k > 0]
    judged = int(sum(tokens * judged_per_token(alpha, k) for k in drafting))
    if judged <= 0:
        return Band(alpha, alpha, alpha, None)
    low, high = wilson(alpha * judged, judged)
    return Band(alpha, low, high, judged)


def drift(band: Band | None, accepted: float, judged: float, draft_tokens: float,
          missing: str = "no calibration profile") -> dict:
    """The server's α over the window against the profile's: outside only when the server's own 95 %
    interval and the profile's do not overlap (both are samples; touching counts as inside)."""
    out = {"min_draft_tokens": MIN_DRAFT_TOKENS, "draft_tokens": int(draft_tokens), "warning": False,
           "alpha": round(accepted / judged, 4) if judged > 0 else None}
    if band is None:
        return out | {"verdict": NO_PROFILE, "text": f"{missing}: drift from it cannot be judged"}
    out |= {"profile_alpha": band.alpha, "profile_interval": [round(band.low, 4), round(band.high, 4)],
            "profile_judged_estimate": band.judged}
    if draft_tokens < MIN_DRAFT_TOKENS or judged <= 0:
        return out | {"verdict": TOO_FEW, "text": f"{int(draft_tokens)} tokens drafted (under {MIN_DRAFT_TOKENS}): "
                                                  "too few drafts to tell drift"}
    low, high = wilson(accepted, judged)
    out["interval"] = [round(low, 4), round(high, 4)]
    verdict = BELOW if high < band.low else ABOVE if low > band.high else INSIDE
    profile = f"the profile's {band.alpha:.2f} ({band.low:.2f}-{band.high:.2f})"
    if verdict == INSIDE:
        return out | {"verdict": verdict, "text": f"α {accepted / judged:.2f} is inside {profile}"}
    return out | {"verdict": verdict, "warning": True,
                  "text": f"traffic drifted: α {accepted / judged:.2f} is {verdict} {profile}; {RECALIBRATE}"}


def recommendation(schedule: Schedule, band: Band | None, spec: Snapshot, scope: str, running: int,
                   profile: str = "no calibration profile", notes: tuple[str, ...] = ()) -> dict:
    """One reading's comparison: the K the export recommends at this load, the K the server drafts
    (over ``spec``, the window, or since its start when nothing was drafted in the window), and
    whether its acceptance drifted from the profile (``profile``: which one, or why there is none)."""
    drafts, tokens = spec.value(metrics.DRAFTS), spec.value(metrics.DRAFT_TOKENS)
    accepted, positions = spec.value(metrics.ACCEPTED), spec.per_position()
    k, source = recommended_k(schedule, running)
    measured = measured_k(drafts, tokens, spec.value(metrics.GENERATION_TOKENS))
    agree = k_agrees(k, measured)
    drawn = ("none drafted" if drafts <= 0 else f"{measured:.2f} per draft") + f" ({scope})"
    if measured is None:
        drawn = f"none drafted, nothing generated ({scope})"
    verdict = "agree" if agree else "differ" if agree is False else "cannot tell"
    judged = drafts + sum(positions[:-1]) if drafts > 0 else 0.0
    return {"running": running, "recommended_k": k, "recommended_from": source,
            "measured_k": None if measured is None else round(measured, 3), "measured": drawn, "agree": agree,
            "text": f"K: export {k} at {max(running, 1)} running, server {drawn}: {verdict}",
            "profile": profile,
            "drift": drift(band, accepted, judged, tokens, profile) | ({"notes": list(notes)} if notes else {})}
