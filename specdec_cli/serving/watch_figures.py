"""What `specdec watch` shows of a running server, as pure functions of two /metrics snapshots:
acceptance over the interval (the whole life of the server when nothing was drafted in it),
per-position acceptance, mean acceptance length, generation tok/s, TTFT and ITL percentiles from
the histograms, requests running and waiting, and the break-even judgement from a bench curve."""

from __future__ import annotations

from . import metrics, stats
from .metrics import Snapshot


def figures(cumulative: Snapshot, window: Snapshot) -> dict:
    """Figures over ``window`` (the difference of two snapshots), falling back to ``cumulative``
    for acceptance and latency where the window saw nothing."""
    spec, scope = acceptance_scope(cumulative, window)
    sglang = cumulative.has(metrics.SGLANG["accept_length"])
    out = {
        "engine": "sglang" if sglang else cumulative.engine,
        "window_s": round(window.taken, 3),
        "acceptance_scope": scope,
        "acceptance": stats.acceptance(spec.value(metrics.DRAFTS), spec.value(metrics.DRAFT_TOKENS),
                                       spec.value(metrics.ACCEPTED), spec.per_position()),
        "generation_tok_s": round(window.value(metrics.GENERATION_TOKENS) / window.taken, 3) if window.taken > 0 else None,
        "running": int(cumulative.value(metrics.RUNNING)), "waiting": int(cumulative.value(metrics.WAITING)),
    }
    if sglang:  # SGLang exports gauges, not counters
        out["acceptance"] |= {"mean_acceptance_length": cumulative.value(metrics.SGLANG["accept_length"]),
                              "acceptance_rate": cumulative.value(metrics.SGLANG["accept_rate"])}
        out["running"] = int(cumulative.value(metrics.SGLANG["running"]))
        out["waiting"] = int(cumulative.value(metrics.SGLANG["waiting"]))
    for name, histogram in (("ttft", metrics.HISTOGRAMS["ttft"]), ("itl", metrics.itl_histogram(cumulative))):
        source = window if window.buckets(histogram) and window.buckets(histogram)[-1][1] > 0 else cumulative
        buckets = source.buckets(histogram)
        out[name] = {f"p{q}_ms": _ms(stats.histogram_quantile(buckets, q / 100)) for q in (50, 90, 99)}
        out[name]["scope"] = "interval" if source is window else "since start"
    return out


def acceptance_scope(cumulative: Snapshot, window: Snapshot) -> tuple[Snapshot, str]:
    """The window when it drafted anything, else the server's whole life: what acceptance (and the
    drafted K, drift.py) are measured over."""
    return (window, "interval") if window.value(metrics.DRAFTS) > 0 else (cumulative, "since start")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def gain_at(curve: dict, mode: str, concurrency: float) -> float | None:
    """The bench curve's gain for ``mode`` at a concurrency, linear between measured levels, held flat
    beyond the ends."""
    points = sorted((int(level), g["gain"]) for level, g in curve.get("gain", {}).get(mode, {}).items() if g["gain"] is not None)
    if not points:
        return None
    if concurrency <= points[0][0]:
        return points[0][1]
    for (l0, g0), (l1, g1) in zip(points, points[1:]):
        if concurrency <= l1:
            return g0 + (g1 - g0) * (concurrency - l0) / (l1 - l0)
    return points[-1][1]


def judgement(curve: dict | None, mode: str | None, running: int) -> dict:
    """Is speculation paying at this load? From the measured curve when there is one."""
    if not curve:
        return {"paying": None, "text": "no bench curve given (--curve BENCH.json): acceptance alone cannot tell "
                                        "whether speculation pays at this load"}
    modes = [m for m in curve.get("gain", {}) if mode in (None, m)]
    if not modes:
        return {"paying": None, "text": f"the bench curve has no mode {mode!r}"}
    level = max(running, 1)
    value = gain_at(curve, modes[0], level)
    crossover = curve.get("crossover", {}).get(modes[0])
    if value is None:
        return {"paying": None, "text": f"the bench curve has no gain for {modes[0]}"}
    where = f"; the curve's crossover is at concurrency {crossover:g}" if crossover is not None else ""
    paying = value > 1.0
    verb = "pays" if paying else "does NOT pay"
    return {"paying": paying, "mode": modes[0], "gain": round(value, 3),
            "text": f"{modes[0]} {verb} at {level} running: {value:.2f}× plain on the bench curve{where}"}
