"""What the core tells the user while it works (a conversion that takes a minute, a cache file made
again): said through the standard ``logging`` module, on the ``specdec`` logger, so that no stage
below the command line writes to a terminal itself. The command line renders the records (cli.py:
`specdec: MESSAGE` and `specdec: warning: MESSAGE` on stderr); a program that imports specdec
handles them as it handles any library's."""

from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger("specdec")


class _Rendered(logging.Handler):
    def __init__(self, info: Callable[[str], None], warning: Callable[[str], None]):
        super().__init__(logging.INFO)
        self.info, self.warning = info, warning

    def emit(self, record: logging.LogRecord) -> None:
        (self.warning if record.levelno >= logging.WARNING else self.info)(record.getMessage())


def render(info: Callable[[str], None], warning: Callable[[str], None]) -> None:
    """Hand every notice from now on to ``info`` or ``warning`` (the one renderer: a later call replaces it)."""
    for handler in [h for h in log.handlers if isinstance(h, _Rendered)]:
        log.removeHandler(handler)
    log.addHandler(_Rendered(info, warning))
    log.setLevel(logging.INFO)
