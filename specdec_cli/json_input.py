"""JSON that a user's file or pipe hands in, read within bounds.

Python's parser recurses once per nesting level, so a line of 200,000 ``[`` ends in a RecursionError
(a traceback) rather than a parse error; and a reader that takes any line length holds a runaway line
in memory and parses it before finding it useless. Every reader of user JSON goes through ``loads``:
too deep or too long is a ``ValueError`` like any other malformed input, which each reader already
turns into its one line.
"""

from __future__ import annotations

import json

MAX_LINE_CHARS = 4 * 1024 * 1024  # one JSON line (a prompt, a store entry): far above any real one


class JsonTooLarge(ValueError):
    """Input past a bound, too deep or too long: a ValueError, so that readers treat it as malformed."""


def loads(text: str, max_chars: int | None = MAX_LINE_CHARS):
    """``json.loads`` that refuses text past ``max_chars`` (None: unbounded) and nesting past what the
    parser's recursion allows (about a thousand levels; no specdec format nests more than a few)."""
    if max_chars is not None and len(text) > max_chars:
        raise JsonTooLarge(f"longer than {max_chars:,} characters")
    try:
        return json.loads(text)
    except RecursionError:
        raise JsonTooLarge("nested too deeply") from None
