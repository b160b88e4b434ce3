"""Errors that are the user's to fix: the CLI prints them as one line and exits with code 2; and the
JSON a user's file or pipe hands in, read within bounds so that a bad one is such an error."""

import json
from pathlib import Path

# One JSON line (a prompt, a store entry): far above any real one. A reader that takes any length
# holds a runaway line in memory and parses it before finding it useless.
MAX_LINE_CHARS = 4 * 1024 * 1024


class UserError(Exception):
    pass


class PromptTooLong(UserError):
    """A prompt the target's context cannot hold; the command line adds which prompt, and where it is
    (prompts.named)."""

    @classmethod
    def check(cls, tokens: int, context: int | None) -> None:
        """A prompt of ``tokens`` leaves the context (None: unbounded) room for one new token, or this error."""
        if context and tokens >= context:
            raise cls(f"the prompt is {tokens} tokens; the target's context holds {context}")


def first_line(exc: BaseException) -> str:
    """An exception's message as one line of a UserError: its first line, or its type's name when it says nothing."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class JsonTooLarge(ValueError):
    """User JSON past a bound, too deep or too long: a ValueError, so that readers treat it as malformed."""


def loads(text: str, max_chars: int | None = MAX_LINE_CHARS):
    """``json.loads`` that refuses text past ``max_chars`` (None: unbounded), and nesting past what the
    parser's recursion allows (about a thousand levels; no specdec format nests more than a few), which
    would otherwise end in a RecursionError traceback rather than a parse error."""
    if max_chars is not None and len(text) > max_chars:
        raise JsonTooLarge(f"longer than {max_chars:,} characters")
    try:
        return json.loads(text)
    except RecursionError:
        raise JsonTooLarge("nested too deeply") from None


def read_json(path: Path, option: str):
    """A JSON file the user named with ``option``: unreadable or not JSON is one UserError line."""
    try:
        return loads(Path(path).read_text(encoding="utf-8"), max_chars=None)
    except OSError as exc:
        raise UserError(f"{option} {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{option} {path}: not JSON ({exc})") from None


def json_type(value) -> str:
    """JSON's name for a parsed value's type, for a message saying what came instead of an object."""
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")
