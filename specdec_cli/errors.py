"""Errors that are the user's to fix: the CLI prints them as one line and exits with code 2."""

import json
from pathlib import Path


class UserError(Exception):
    pass


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
