"""The live acceptance view on stderr: every token marked by how it came to be, and running figures.

While a prompt runs, accepted draft tokens are green, rejected ones are shown struck out and dimmed
where the target replaced them, and tokens the target chose itself (correction or bonus) are bold.
Strike and bold survive NO_COLOR, so the marking stays readable without colour. Two sparklines of
the recent rounds, acceptance above speed, make a collapse of acceptance (and what it costs) visible.

When the prompt is done the view goes, and what stays is the answer as the target wrote it: the
rejected drafts are counted in the summary line, never left between the words, so that text copied
from the screen (or captured by `script`/tmux) is the answer. Every line fits the terminal's width.
"""

from __future__ import annotations

from collections import deque

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from ..decoding.engine import RoundEvent
from ..decoding.events import CONTEXT
from ..measure.run_stats import RunStats
from ..pairs.tokenization import Detokenizer

ACCEPTED = "green"
REJECTED = "strike dim red"
TARGET = "bold"
BARS = "▁▂▃▄▅▆▇█"
HISTORY = 40  # rounds in the sparklines


class LiveView:
    def __init__(self, console: Console, tokenizer, title: str):
        self.console = console
        self.detok = Detokenizer(tokenizer)
        self.title = title
        self.text = Text()  # what the running view shows: rejected drafts included
        self.clean = Text()  # the answer alone: accepted drafts (green) and the target's own tokens
        self.k: int | str = 0
        self.stats: RunStats | None = None
        self.note: str | None = None  # the adaptive controller's state, under `-k auto`
        self.acceptance: deque[float | None] = deque(maxlen=HISTORY)  # per round; None when nothing was drafted
        self.speed: deque[float] = deque(maxlen=HISTORY)  # tokens per second of each round
        self.live = Live(console=console, transient=True, auto_refresh=False, redirect_stdout=False)

    def __enter__(self) -> "LiveView":
        self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        self.live.stop()

    def show_answer(self) -> None:
        """The finished answer in its panel on stderr: for when stdout is not this terminal."""
        self.console.print(Panel(self.clean, title=self.title, title_align="left", border_style="dim"))

    def show_summary(self) -> None:
        if self.stats:
            self.console.print(summary(self.stats), highlight=False, soft_wrap=True)

    def update(self, event: RoundEvent, stats: RunStats, note: str | None = None) -> None:
        self.stats, self.k, self.note = stats, event.k, note
        self.acceptance.append(event.accepted / len(event.drafted) if event.drafted else None)
        seconds = event.draft_s + event.verify_s
        self.speed.append(len(event.emitted) / seconds if seconds > 0 else 0.0)
        kept = self.detok.push(event.emitted[: min(event.accepted, len(event.emitted))])
        self.text.append(kept, ACCEPTED)
        self.clean.append(kept, ACCEPTED)
        if event.rejected and event.token is not None:
            # A rejected line break would break the layout with nothing visible to strike out.
            self.text.append(self.detok.peek(event.rejected).replace("\n", "⏎"), REJECTED)
        if event.token is not None:
            own = self.detok.push([event.token])
            self.text.append(own, TARGET)
            self.clean.append(own)
        self.live.update(self._render(), refresh=True)

    def _render(self) -> Group:
        width = self.console.width - 4
        lines = self.text.wrap(self.console, width)
        room = max(3, self.console.height - 6)
        tail = Text("\n").join(lines[-room:]) if len(lines) > room else self.text
        panel = Panel(tail, title=self.title, title_align="left", border_style="dim")
        return Group(panel, fit(self._status(), self.console.width), fit(self._history(), self.console.width))

    def _history(self) -> Text:
        line = Text(" acceptance ", style="dim").append(sparkline(self.acceptance, 1.0), ACCEPTED)
        top = max(self.speed, default=0.0)
        line.append("   tok/s ", style="dim").append(sparkline(self.speed, top))
        if self.note:
            line.append(f"   {self.note}", style="bold")
        return line

    def _status(self) -> Text:
        s = self.stats
        status = Text(f" K {self.k}  ", style="bold")
        status.append(f"acceptance {s.acceptance_rate:6.1%}", ACCEPTED)
        status.append(f"  {s.tokens_per_s:6.1f} tok/s  {s.mean_accepted_length:.2f} tok/round  {s.new_tokens} tokens")
        if s.stop == CONTEXT:  # the answer is cut here, not ended
            status.append("  context full", style="bold yellow")
        status.append("   accepted", ACCEPTED).append(" · ").append("rejected", REJECTED).append(" · ")
        status.append("target", TARGET)
        return status


def fit(line: Text, width: int) -> Text:
    """One line, cut to the terminal's width: a status line that wraps pushes the view down a row
    per refresh and leaves its old copies behind."""
    line.no_wrap = True
    line.truncate(max(width - 1, 1), overflow="ellipsis")
    return line


def sparkline(values, top: float) -> str:
    """One bar per value scaled to ``top``; a blank for a round with nothing to show (no draft)."""
    bars = []
    for value in values:
        if value is None:
            bars.append(" ")
        else:
            share = min(max(value / top, 0.0), 1.0) if top > 0 else 0.0
            bars.append(BARS[round(share * (len(BARS) - 1))])
    return "".join(bars)


def summary(stats: RunStats) -> Text:
    """One line per prompt: the figures that only mean something together."""
    line = Text()
    if not stats.lossless:
        line.append(f"LOSSY ({stats.accept}): not the target's own output · ", style="bold yellow reverse")
    first = f"first after {stats.ttft_s:.2f} s, " if stats.ttft_s is not None else ""
    line.append(f"{stats.new_tokens} tokens in {stats.wall_s:.2f} s ({first}{stats.tokens_per_s:.1f} tok/s) · ")
    line.append(f"acceptance {stats.acceptance_rate:.1%}", ACCEPTED)
    line.append(
        f" ({stats.accepted}/{stats.drafted} drafts, {stats.drafted - stats.accepted} rejected) · "
        f"{stats.mean_accepted_length:.2f} tokens/round over "
        f"{stats.rounds} rounds · K={stats.k} · draft {stats.draft_s:.2f} s, verify {stats.verify_s:.2f} s"
    )
    return line
