"""The live view of many prompts decoded at once (`generate --batch N`): one status line of the job
(prompts done, running, tokens/s, acceptance, the K the batch drafts at) where the per-token view
of one prompt would be unreadable, and one summary line of the job at its end."""

from __future__ import annotations

import time
from collections import deque

from rich.console import Console
from rich.live import Live
from rich.text import Text

from ..decoding.events import RoundEvent
from ..measure.run_stats import RunStats
from ..serving.stats import percentile
from .live import ACCEPTED, fit

RECENT = 64  # rounds the batch's K is averaged over


class BatchView:
    """A transient status line; ``console`` None: nothing shown."""

    def __init__(self, console: Console | None):
        self.console = console
        self.started = time.perf_counter()
        self.tokens = self.drafted = self.accepted = 0
        self.recent: deque[tuple[int, int]] = deque(maxlen=RECENT)  # (K, answers in the forward) per round
        self.live = None if console is None else Live(console=console, transient=True, auto_refresh=False,
                                                     redirect_stdout=False)

    def __enter__(self) -> "BatchView":
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()

    def update(self, event: RoundEvent, done: int, failed: int) -> None:
        self.tokens += len(event.emitted)
        self.drafted += len(event.drafted)
        self.accepted += event.accepted
        self.recent.append((event.k, event.batch))
        if self.live is not None:
            self.live.update(fit(self.status(done, failed), self.console.width), refresh=True)

    def status(self, done: int, failed: int) -> Text:
        seconds = time.perf_counter() - self.started
        k = sum(k for k, _ in self.recent) / len(self.recent) if self.recent else 0.0
        batch = max((b for _, b in self.recent), default=0)
        line = Text(f" {done} done" + (f", {failed} failed" if failed else "") + f" · {batch} at once · ", style="bold")
        line.append(f"{self.tokens / seconds if seconds > 0 else 0.0:6.1f} tok/s · ")
        line.append(f"acceptance {self.accepted / self.drafted if self.drafted else 0.0:6.1%}", ACCEPTED)
        line.append(f" · K {k:.1f}")
        return line


def job_summary(stats: list[RunStats], seconds: float, failed: int) -> Text:
    """One line for the whole job: throughput, and the prompts' latency percentiles (serving/stats.py's
    definition, the engine bench's)."""
    tokens = sum(s.new_tokens for s in stats)
    latency = [s.wall_s for s in stats]
    figures = ", ".join(f"p{q} {percentile(latency, q):.2f} s" for q in (50, 90, 99))
    drafted = sum(s.drafted for s in stats)
    line = Text(f"{len(stats)} prompts" + (f" ({failed} failed)" if failed else "") +
                f": {tokens} tokens in {seconds:.2f} s ({tokens / seconds if seconds > 0 else 0.0:.1f} tok/s) · ")
    line.append(f"latency {figures} · ")
    line.append(f"acceptance {sum(s.accepted for s in stats) / drafted if drafted else 0.0:.1%}", ACCEPTED)
    return line
