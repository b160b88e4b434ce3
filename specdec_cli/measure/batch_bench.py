"""`specdec bench --batch 1,2,4,8,16`: speculation's gain against the batch size in specdec's own loop.

For each batch size B and each mode, every prompt goes through one fresh engine of that mode as one
job, ``SpeculativeEngine.run(requests, batch=B)`` (continuous batching, as `generate --batch B`), timed
whole. auto gives each prompt a schedule of its own controller, as `generate -k auto` does. Warm-up
jobs per mode (at the largest size, and one prompt alone) count for nobody; then the sizes in ascending order, each
with the modes in an order rotated from size to size (interleaved.py), so that drift falls on every
mode alike. Every prompt's tokens, in every mode at every size, are compared with plain decoding's at
batch 1. The figures are batch_figures.py's.
"""

from __future__ import annotations

import time
from typing import Callable

from ..decoding.acceptance import SamplingParams
from ..decoding.loaded_pair import LoadedPair, load_pair
from ..pairs.profile import ProfileWatcher
from ..pairs.tokenization import encode_prompt
from ..prompts import Prompt, check_fit
from .batch_figures import Job, fixed_k, report
from .interleaved import rotated
from .loop_bench import Bench, Mode
from .run_stats import RunStats


def run_job(bench: Bench, mode: Mode, prompts: list[Prompt], encoded: list[list[int]], batch: int,
            progress: Callable[[], None] | None = None) -> Job:
    """Every prompt through a fresh engine of ``mode``, ``batch`` at once. A prompt's latency runs
    from when the engine takes its request (the place it waited for is free) to its last round, as
    `generate --batch` reports it (commands/answering.py); ``progress()`` after each prompt done."""
    engine, k_for = bench.engine_for(mode)
    stats: list[RunStats] = []
    tokens: list[list[int]] = [[] for _ in prompts]

    def requests():
        for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
            k = k_for(prompt)
            stats.append(RunStats(k if isinstance(k, int) else "auto", str(mode.rule)))
            yield engine.request(ids, k=k, max_new_tokens=bench.max_new_tokens, sampling=bench.sampling,
                                 seed=bench.seed, rule=mode.rule, key=index)

    at_once, started = 1, time.perf_counter()
    for request, event in engine.run(requests(), batch):
        at_once = max(at_once, event.batch)
        stats[request.key].add(event)
        tokens[request.key] += event.emitted
        if event.finished:
            stats[request.key].finish()
            if progress is not None:
                progress()
    wall_s = time.perf_counter() - started
    return Job(tokens, [s.wall_s for s in stats], wall_s, rounds=sum(s.rounds for s in stats),
               drafted=sum(s.drafted for s in stats), accepted=sum(s.accepted for s in stats),
               judged=sum(s.judged for s in stats), fallback_forwards=sum(s.fallback_forwards for s in stats),
               at_once=at_once)


def run(bench: Bench, modes: list[Mode], prompts: list[Prompt], encoded: list[list[int]], sizes: list[int],
        progress: Callable[[], None] | None = None) -> dict[int, dict[Mode, Job]]:
    """The warm-up (every mode on the first prompts, as many as the largest size takes, then on the first
    alone), then every mode at every size (ascending), the modes' order rotated by one place from size to size."""
    check_fit(prompts, encoded, bench.runtime.engine.context_length)  # before a mode loads or runs
    bench.runtime.engine.check_batch(sizes[-1])  # a target without the lean forward batches nothing
    warm = min(len(prompts), sizes[-1])
    for mode in modes:  # first-call costs are nobody's: the largest blocks', and one prompt alone's (its own path)
        run_job(bench, mode, prompts[:warm], encoded[:warm], sizes[-1])
        run_job(bench, mode, prompts[:1], encoded[:1], 1)
    jobs: dict[int, dict[Mode, Job]] = {}
    for turn, size in enumerate(sizes):
        done = {mode: run_job(bench, mode, prompts, encoded, size, progress) for mode in rotated(modes, turn)}
        jobs[size] = {mode: done[mode] for mode in modes}  # reported in the modes' own order
    return jobs


def measure(bench: Bench, modes: list[Mode], prompts: list[Prompt], encoded: list[list[int]], sizes: list[int],
            progress: Callable[[], None] | None = None) -> dict:
    """``modes`` run at ``sizes`` (``run``) and ``report``ed: bench --batch's figures, and calibrate-k --batch's."""
    jobs = run(bench, modes, prompts, encoded, sizes, progress)
    named = {size: {str(mode): job for mode, job in by_mode.items()} for size, by_mode in jobs.items()}
    return report(sizes, named, fixed_k(modes))


def bench_pair(spec, modes: list[Mode], prompts: list[Prompt], max_new_tokens: int, sampling: SamplingParams,
               seed: int, watcher: ProfileWatcher | None, sizes: list[int],
               progress: Callable[[], None] | None = None) -> tuple[LoadedPair, dict]:
    """The pair ``spec`` loaded, ``modes`` measured at ``sizes`` (``measure``) under "batch";
    ``watcher``: the profile that seeds auto, as loop_bench.bench_pair. The runtime, for a manifest."""
    runtime = load_pair(spec)
    if watcher is not None:
        watcher.expect(runtime.target.computed_by())
    bench = Bench(runtime, max_new_tokens, sampling, seed, watcher.profile if watcher else None)
    encoded = [encode_prompt(runtime.tokenizer, p.text) for p in prompts]
    return runtime, {"batch": measure(bench, modes, prompts, encoded, sizes, progress)}
