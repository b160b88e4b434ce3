"""Errors that are the user's to fix: the CLI prints them as one line and exits with code 2."""

import json
from pathlib import Path


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


def read_json(path: Path, option: str):
    """A JSON file the user named with ``option``: unreadable or not JSON is one UserError line."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{option} {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{option} {path}: not JSON ({exc})") from None


def json_type(value) -> str:
    """JSON's name for a parsed value's type, for a message saying what came instead of an object."""
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")
