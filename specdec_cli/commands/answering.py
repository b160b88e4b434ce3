"""`specdec generate`'s answers to a stream of prompts: each prompt a request to the engine, up to
``--batch`` decoded at once, every result written in input order as soon as the order allows, and a
line that cannot be answered failing alone, in its place."""

from __future__ import annotations

import json
import os
import queue
import stat
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from ..prompts import BadPrompt, Prompt, named
from . import interrupt
from .common import error_line, warning_line

if TYPE_CHECKING:
    from ..decoding.request import Request
    from ..decoding.loaded_pair import LoadedPair
    from ..measure.run_stats import RunStats
    from .live import LiveView


@dataclass
class Settings:
    """What every prompt of a run is answered with; ``schedule_for(item)`` gives its K (an int, a
    schedule, or None for the pair's K of its scenario) and the statistics that come with it."""

    runtime: LoadedPair
    schedule_for: Callable[[Prompt], tuple[object, dict]]
    max_new_tokens: int
    sampling: object
    seed: int
    raw: bool
    rule: object
    tree: int | str | None
    json_lines: bool
    computed_by: dict
    batch: int = 1


@dataclass
class Job:
    """One prompt in progress: its place in the output, its K, statistics and tokens so far."""

    index: int
    item: Prompt
    k: object
    extra: dict
    stats: RunStats
    emitted: list[int] = field(default_factory=list)
    batched: list[int] = field(default_factory=list)  # per round: answers in the same forward
    shared: int = 0  # prompt tokens whose cache it copied from another answer's (decoding/shared_prefix.py)
    view: LiveView | None = None


class InOrder:
    """Outputs written in input order: a finished answer waits for the ones before it."""

    def __init__(self):
        self.places = 0
        self.waiting: dict[int, Callable[[], None]] = {}
        self.next = 0
        self.written = 0  # answers written (failures not counted)

    def place(self) -> int:
        self.places += 1
        return self.places - 1

    def done(self, index: int, write: Callable[[], None]) -> None:
        self.waiting[index] = write
        while self.next in self.waiting:
            self.waiting.pop(self.next)()
            self.next += 1

    def drain(self) -> None:
        """On a stop: the finished answers still waiting for an unfinished one are written too, in order."""
        for index in sorted(self.waiting):
            self.waiting.pop(index)()


def answer(settings: Settings, prompts: Iterable[Prompt | BadPrompt], console) -> int:
    """Answer ``prompts`` (``console``: the terminal's, for the live views; None: no view). Returns
    how many lines failed."""
    from .batch_view import BatchView, job_summary

    order, failures, jobs, started = InOrder(), [0], [], time.perf_counter()
    running = [0]  # answers in progress
    incoming = Incoming(prompts, threaded=settings.batch > 1)
    warned = [False]
    engine = settings.runtime.engine

    def failed(index: int, bad: BadPrompt) -> None:
        failures[0] += 1
        order.done(index, lambda: _write_failure(bad, settings.json_lines))

    def requests() -> Iterator[Request | None]:
        doing = "reading the prompts"
        while True:
            interrupt.now(doing, interrupt.answered(order.written))
            item = incoming.next(wait=running[0] == 0)
            if item is Incoming.NOT_YET:
                yield None  # the running answers go on
                continue
            if item is Incoming.END:
                return
            doing = "reading the next prompt"
            if isinstance(item, BadPrompt):  # a line of the stream that is no prompt
                failed(order.place(), item)
                continue
            index = order.place()
            try:
                request = _request(settings, item, index)
            except BadPrompt as bad:  # longer than the context
                if item.line is None:  # the command line's one prompt: the mistake is the command's, exit 2
                    raise
                failed(index, bad)
                continue
            job = request.key
            jobs.append(job)
            running[0] += 1
            interrupt.now(f"answering {item.label}" if settings.batch == 1 else "answering the prompts",
                          interrupt.answered(order.written))
            if console is not None and settings.batch == 1:
                job.view = stack.enter_context(_token_view(settings, item, console))
            yield request

    def finished(job: Job) -> None:
        running[0] -= 1
        job.stats.finish()
        if job.view is not None:
            job.view.__exit__(None, None, None)
        result = _result(settings, job)
        order.done(job.index, lambda: _write(settings, job, result, warned, order))

    with ExitStack() as stack:
        view = stack.enter_context(BatchView(console)) if console is not None and settings.batch > 1 else None
        try:
            for request, event in engine.run(requests(), settings.batch):
                job = request.key
                job.stats.add(event)
                job.emitted += event.emitted
                job.batched.append(event.batch)
                job.shared = request.shared
                if job.view is not None:
                    job.view.update(event, job.stats, job.k.describe() if _adaptive(job) else None)
                if view is not None:
                    view.update(event, order.written, failures[0])
                if event.finished:
                    finished(job)
        except KeyboardInterrupt:
            order.drain()  # finished answers behind an unfinished one are kept too
            interrupt.now(interrupt.current()[0], interrupt.answered(order.written))
            raise
    if console is not None and settings.batch > 1 and jobs:
        console.print(job_summary([j.stats for j in jobs], time.perf_counter() - started, failures[0]), soft_wrap=True,
                      highlight=False)
    return failures[0]


class Incoming:
    """The prompts as they come. ``threaded`` (a batch): read by a thread of their own, so that a batch
    takes the ones that are there and goes on with its running answers rather than wait for a slow
    pipe's next line; else read when asked."""

    NOT_YET, END = object(), object()

    def __init__(self, prompts: Iterable[Prompt | BadPrompt], threaded: bool):
        self.items, self.queue = iter(prompts), None
        if threaded:
            self.queue = queue.Queue()
            threading.Thread(target=self._read, daemon=True, name="specdec-prompts").start()

    def _read(self) -> None:
        try:
            for item in self.items:
                self.queue.put(item)
            self.queue.put(self.END)
        except BaseException as failure:  # the reader's error is the command's: raised where it reads
            self.queue.put(failure)

    def next(self, wait: bool):
        """The next prompt, END after the last; without ``wait``, NOT_YET when none has come yet."""
        if self.queue is None:
            return next(self.items, self.END)
        try:
            item = self.queue.get(block=wait)
        except queue.Empty:
            return self.NOT_YET
        if isinstance(item, BaseException):
            raise item
        return item


def _request(settings: Settings, item: Prompt, index: int) -> Request:
    """The engine's request for ``item``, its Job as the key; a prompt the context cannot hold is named."""
    from ..measure.run_stats import RunStats
    from ..pairs.tokenization import encode_prompt

    runtime = settings.runtime
    k, extra = settings.schedule_for(item)
    k = runtime.pair.k_for(item.scenario) if k is None else k
    ids = encode_prompt(runtime.tokenizer, item.text, settings.raw)
    stats = RunStats("auto" if not isinstance(k, int) else k, str(settings.rule), tree=settings.tree)
    job = Job(index, item, k, extra, stats)
    with named(item):
        return runtime.engine.request(ids, k=k, max_new_tokens=settings.max_new_tokens, sampling=settings.sampling,
                                      seed=settings.seed, rule=settings.rule, key=job)


def _adaptive(job: Job) -> bool:
    return not isinstance(job.k, int)


def _token_view(settings: Settings, item: Prompt, console) -> LiveView:
    """The per-token view of one prompt (transient: gone when the prompt is done)."""
    from .live import LiveView

    runtime = settings.runtime
    drafting = f"{runtime.drafter.name} drafter" if runtime.drafter is not None else "plain decoding"
    return LiveView(console, runtime.tokenizer, f"{runtime.pair.name} · {drafting} · prompt {item.id}")


def _result(settings: Settings, job: Job) -> dict:
    """A finished prompt's result object, as --json writes it."""
    stats = job.stats.as_dict() | (job.k.report() if _adaptive(job) else {})
    stats["computed_by"] = settings.computed_by
    stats |= job.extra
    if settings.batch > 1:  # how many answers shared its rounds' forwards
        rounds = job.batched or [1]
        stats["batch"] = {"size": settings.batch, "mean": round(sum(rounds) / len(rounds), 2), "max": max(rounds),
                          "prompt_shared": job.shared}
    result = {
        "id": job.item.id,
        "prompt": job.item.text,
        "text": settings.runtime.tokenizer.decode(job.emitted, skip_special_tokens=True),
        "token_ids": job.emitted,
        "stats": stats,
    }
    if job.item.scenario is not None:
        result["scenario"] = job.item.scenario
    return result


def _write(settings: Settings, job: Job, result: dict, warned: list[bool], order: InOrder) -> None:
    """A result on stdout (JSON or the text: always, so that copy, tee and script get the clean answer)."""
    from ..decoding.events import CONTEXT

    if result["stats"]["fallback_forwards"] and not warned[0]:  # once a run: a slowdown nothing else shows
        warning_line(f"prompt {job.item.id}: {result['stats']['fallback_forwards']} target forward(s) ran transformers' "
                     "forward instead of the lean int8/int4 one (slower); fallback_forwards counts them")
        warned[0] = True
    if job.view is not None and stdout_is_a_file():
        job.view.show_answer()  # the answer goes to a file: the terminal keeps its own copy
    order.written += 1  # said before it is printed: a reader that has the result is told it was written
    doing = "reading the next prompt" if settings.batch == 1 else interrupt.current()[0]
    interrupt.now(doing, interrupt.answered(order.written))
    if settings.json_lines:
        print(json_line(result), flush=True)
    else:
        print(result["text"], flush=True)
        if result["stats"]["stop"] == CONTEXT:  # --json says it in the stats
            warning_line(context_cut(job.item, result["stats"]["new_tokens"], settings.runtime.engine.context_length))
    if job.view is not None:
        job.view.show_summary()


def _write_failure(bad: BadPrompt, json_lines: bool) -> None:
    """A prompt of the stream that cannot be answered: its line on stderr, its error object in --json
    (``{"id", "line", "error"}``); the stream goes on."""
    error_line(str(bad))
    if json_lines:
        print(json_line(bad.as_json()), flush=True)


def json_line(record: dict) -> str:
    """One result or error object as --json writes it: valid JSON always (no NaN, no Infinity), so that
    a reader's parser never stops at a line; prompts.py refuses the ids that would need them."""
    return json.dumps(record, ensure_ascii=False, allow_nan=False)


def stdout_is_a_file() -> bool:
    """stdout redirected to a file, not a terminal nor a pipe (`| tee`, `| less` show it themselves)."""
    try:
        mode = os.fstat(sys.stdout.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return False
    return not sys.stdout.isatty() and not stat.S_ISFIFO(mode)


def context_cut(item: Prompt, tokens: int, context: int) -> str:
    """Text mode's word that an answer ends because the target's context is full, not by its own end."""
    return f"{item.label}: the answer stopped after {tokens} tokens, at the end of the target's {context}-token context"
