"""Load on a server: a closed loop (N requests in flight, each worker sending its next as soon as
its last returns) or an open loop (Poisson arrivals at a rate), every request timed, the server's
counters scraped before and after each level so acceptance covers exactly that window."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from . import metrics, stats
from .client import Completion, Endpoint, ServerDown, complete


class ServerDied(Exception):
    """The server stopped answering in the middle of a level."""


@dataclass(frozen=True)
class Request:
    prompt_id: str
    prompt_ids: list[int]


@dataclass
class LevelRun:
    """One level (a concurrency or a rate) on one server."""

    completions: list[tuple[Request, Completion]] = field(default_factory=list)
    duration_s: float = 0.0
    window: metrics.Snapshot | None = None  # the counters' difference over the level


def requests_for_level(prompts: list[Request], concurrency: int, count: int | None = None) -> list[Request]:
    """``count`` requests, the prompts cycled (or cut); by default every prompt, and at least
    2 × concurrency so that the level is not all ramp-up and ramp-down."""
    want = count if count is not None else max(len(prompts), 2 * concurrency)
    return [prompts[i % len(prompts)] for i in range(want)]


def run_level(endpoint: Endpoint, requests: list[Request], max_tokens: int, *, concurrency: int | None = None,
              rate: float | None = None, seed: int = 0, ignore_eos: bool = True, timeout_s: float = 120.0,
              alive: Callable[[], bool] = lambda: True) -> LevelRun:
    """Closed loop at ``concurrency`` or open loop at ``rate`` requests/s; raises ServerDied when the
    server is gone (``alive`` says so, or it no longer answers /metrics)."""
    before = _scrape(endpoint, alive)
    run = LevelRun()
    lock = threading.Lock()
    pending = list(reversed(requests))
    dead = threading.Event()

    def one(request: Request) -> None:
        if dead.is_set():
            return
        result = complete(endpoint, request.prompt_ids, max_tokens, ignore_eos=ignore_eos, timeout_s=timeout_s)
        if result.error == "connection" and not alive():
            dead.set()
        with lock:
            run.completions.append((request, result))

    def worker() -> None:
        while not dead.is_set():
            with lock:
                if not pending:
                    return
                request = pending.pop()
            one(request)

    started = time.perf_counter()
    if rate is None:
        threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency or 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    else:
        gaps = random.Random(seed)
        with ThreadPoolExecutor(max_workers=min(len(requests), 256)) as pool:
            due = started
            for request in requests:
                due += gaps.expovariate(rate)
                time.sleep(max(0.0, due - time.perf_counter()))
                if dead.is_set():
                    break
                pool.submit(one, request)
    run.duration_s = time.perf_counter() - started
    if dead.is_set() or not alive():
        raise ServerDied(f"the server at {endpoint.url} stopped answering")
    run.window = _scrape(endpoint, alive).minus(before)
    return run


def _scrape(endpoint: Endpoint, alive: Callable[[], bool]) -> metrics.Snapshot:
    try:
        return metrics.scrape(endpoint)
    except ServerDown as exc:
        raise ServerDied(f"the server at {endpoint.url} does not answer /metrics ({exc})") from None


def level_figures(run: LevelRun, slos_ms: dict[str, float] | None = None) -> dict:
    """`vllm bench serve`'s figures for one level, plus acceptance from the counters' window."""
    done = [c for _, c in run.completions if not c.error]
    failures: dict[str, int] = {}
    for _, c in run.completions:
        if c.error:
            failures[c.error] = failures.get(c.error, 0) + 1
    output = sum(c.output_tokens for c in done)
    duration = run.duration_s or 1e-9
    per_request = [{"ttft_ms": c.ttft_s * 1000 if c.ttft_s is not None else None,
                    "tpot_ms": c.tpot_s * 1000 if c.tpot_s is not None else None,
                    "e2el_ms": c.latency_s * 1000 if c.latency_s is not None else None,
                    "error": c.error} for _, c in run.completions]
    figures = {
        "requests": len(run.completions), "completed": len(done), "failed": sum(failures.values()),
        "failures": failures, "duration_s": round(run.duration_s, 3), "output_tokens": output,
        "request_throughput": round(len(done) / duration, 4), "output_tok_s": round(output / duration, 3),
        "ttft": stats.latency_summary([c.ttft_s for c in done if c.ttft_s is not None]),
        "tpot": stats.latency_summary([c.tpot_s for c in done if c.tpot_s is not None]),
        "itl": stats.latency_summary([gap for c in done for gap in c.itl_s]),
        "e2el": stats.latency_summary([c.latency_s for c in done if c.latency_s is not None]),
    }
    if slos_ms:
        figures["goodput"] = stats.goodput(per_request, slos_ms, duration)
    if run.window is not None:
        w = run.window
        figures["acceptance"] = stats.acceptance(w.value(metrics.DRAFTS), w.value(metrics.DRAFT_TOKENS),
                                                 w.value(metrics.ACCEPTED), w.per_position())
    return figures
