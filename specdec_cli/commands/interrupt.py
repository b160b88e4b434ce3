"""What Ctrl-C leaves behind, said in one line: a command tells this module what it is doing and what a
stop now would keep; the entry point (cli.py) says it, `specdec: interrupted while loading the pair;
nothing was written`, and exits 130. SIGTERM (`docker stop`, systemd, `timeout`) takes the same way out,
as ``Terminated``: the same things kept, `specdec: terminated while ...`, exit 143. Module state, as the
signal is the process's: one command runs at a time (cli.py starts each afresh). It imports nothing:
cli.py reads it while its imports load."""

from __future__ import annotations

NOTHING = "nothing was written"

_doing: str | None = None  # e.g. "loading the pair"; None: the command has not said
_kept: str = NOTHING  # what a stop now leaves: written results, readings shown


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt, so that every handler of one (the
    `finally` that saves the memory, the servers' stop, cli.py's line) serves the other."""


def on_sigterm(signum, frame) -> None:
    """The SIGTERM handler cli.py installs while a command runs."""
    raise Terminated()


def begin() -> None:
    """A command starts: nothing done yet, nothing kept."""
    now(None)


def now(doing: str | None, kept: str = NOTHING) -> None:
    """From here on the command is ``doing`` this, and a stop keeps ``kept``."""
    global _doing, _kept
    _doing, _kept = doing, kept


def current() -> tuple[str | None, str]:
    """What the command is doing, and what a stop now keeps: a step that adds to what is kept says it
    on top of them."""
    return _doing, _kept


def line(stop: KeyboardInterrupt | None = None) -> str:
    """The one line Ctrl-C (or, for a ``Terminated`` stop, SIGTERM) leaves, without the `specdec: ` prefix."""
    while_ = f" while {_doing}" if _doing else ""
    return f"{'terminated' if isinstance(stop, Terminated) else 'interrupted'}{while_}; {_kept}"


def answered(count: int) -> str:
    """What a command that streams a result per prompt keeps after ``count`` of them."""
    if count == 0:
        return "no prompt was answered, nothing was written"
    return "1 prompt answered, its result was written" if count == 1 else \
        f"{count} prompts answered, their results were written"
