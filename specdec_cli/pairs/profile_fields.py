"""A calibration profile's values checked one by one as it is read (profile.py). The file is
written by `calibrate-k --write`, but it can be edited, merged or cut short by hand: a K given as a
string, a negative K or a list where a mapping belongs was truncated, taken, or a traceback. Each is
one UserError naming the file, the section and the key (``where``), and the run stops with exit 2,
as any other malformed profile does."""

from __future__ import annotations

import math

from ..errors import UserError
from ..limits import MAX_K

RECALIBRATE = "recalibrate with `specdec calibrate-k --write`"


def required(body: dict, key: str, where: str):
    if key not in body:
        raise UserError(f"{where}: '{key}' is missing; {RECALIBRATE}")
    return body[key]


def k_field(body: dict, key: str, where: str, default: int | None = None) -> int:
    value = body.get(key, default) if default is not None else required(body, key, where)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_K:
        raise UserError(f"{where}: '{key}' must be a whole number from 0 to {MAX_K}, got {value!r}")
    return int(value)


def number(body: dict, key: str, where: str, default: float | None = None, low: float = 0.0,
           high: float = math.inf) -> float:
    """A finite number from ``low`` to ``high`` (YAML's true is an int, and is refused)."""
    value = body.get(key, default) if default is not None else required(body, key, where)
    if not _finite(value) or not low <= value <= high:
        bounds = f"from {low:g} to {high:g}" if high < math.inf else f"of at least {low:g}"
        raise UserError(f"{where}: '{key}' must be a number {bounds}, got {value!r}")
    return float(value)


def costs(body: dict, where: str) -> dict[int, float]:
    """``verify_cost``: K → the cost of a (K+1)-token forward in one-token forwards, each positive."""
    value = body.get("verify_cost")
    value = {} if value is None else value
    if not isinstance(value, dict) or not all(
            isinstance(k, int) and not isinstance(k, bool) and _finite(v) and v > 0 for k, v in value.items()):
        raise UserError(f"{where}: 'verify_cost' must map each K to a positive number, got {value!r}")
    return {int(k): float(v) for k, v in value.items()}


def choice(body: dict, key: str, where: str, choices: tuple[str, ...], default: str) -> str:
    value = body.get(key, default)
    if value not in choices:
        raise UserError(f"{where}: '{key}' must be one of {', '.join(choices)}, got {value!r}")
    return value


def mapping(body: dict, key: str, where: str) -> dict:
    """An optional mapping (versions, settings, drafter, computed_by): absent is empty, anything else is refused."""
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{where}: '{key}' must be a mapping, got {value!r}")
    return value


def string(body: dict, key: str, where: str, default: str = "") -> str:
    value = body.get(key, default)
    if not isinstance(value, str):
        raise UserError(f"{where}: '{key}' must be a string, got {value!r}")
    return str(value)


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
