"""The values of specdec's two YAML files checked one by one as they are read: models.yaml (registry.py)
and calibration profiles (profile.py). Both are edited by hand; a misspelt key would be ignored without
a word, a K given as a string or true (YAML's true is an int) truncated or taken, a list where a
mapping belongs a traceback far from the file. Each is one UserError instead, naming where in the file
(``where``: the file, the pair or section, and the key's path), and the run stops with exit 2."""

from __future__ import annotations

import math
import reprlib
from itertools import islice

from ..errors import UserError
from ..limits import MAX_K

RECALIBRATE = "recalibrate with `specdec calibrate-k --write`"


class _Short(reprlib.Repr):
    """reprlib's bounds, also for the dict, list and str subclasses round-trip YAML reads (reprlib
    would repr those whole, then cut), with a mapping's keys in the file's order. A string (a path,
    a drafter's description) is shown whole up to 200 characters."""

    def __init__(self):
        super().__init__()
        self.maxstring, self.maxother, self.maxlevel, self.maxdict, self.maxlist = 200, 200, 3, 6, 6

    def repr1(self, x, level):
        for kind in (dict, list, tuple, str):
            if isinstance(x, kind) and type(x) is not kind:
                return getattr(self, f"repr_{kind.__name__}")(x, level)
        return super().repr1(x, level)

    def repr_dict(self, x, level):
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        items = [f"{self.repr1(k, level - 1)}: {self.repr1(v, level - 1)}" for k, v in islice(x.items(), self.maxdict)]
        return "{" + ", ".join(items + (["..."] if len(x) > self.maxdict else [])) + "}"


def shown(value) -> str:
    """``value``'s repr for a message, cut short: a value a file hands in may be any size."""
    return _Short().repr(value)


def _whole(value, low: int, high: float = math.inf) -> bool:
    """An int from ``low`` to ``high``, and not a bool (YAML's true is an int)."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --- models.yaml ---------------------------------------------------------------------------------


def known_keys(mapping: dict, known: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(key) for key in mapping if key not in known)
    if unknown:
        raise UserError(f"{where}: unknown key {shown(unknown[0])}; the keys are {', '.join(known)}")


def k_value(value, where: str) -> int:
    if not _whole(value, 0, MAX_K):
        raise UserError(f"{where}: K must be an integer from 0 to {MAX_K}, got {shown(value)}")
    return value


def flag(body: dict, key: str, where: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise UserError(f"{where}: '{key}' is true or false, got {shown(value)}")
    return value


def text(body: dict, key: str, where: str, default: str | None = None, what: str = "a string") -> str | None:
    """A string value (YAML would hand a list or a mapping on to str() without a word)."""
    value = body.get(key, default)
    if value is not None and not isinstance(value, str):
        raise UserError(f"{where}: '{key}' must be {what}, got {shown(value)}")
    return value


def whole_number(body: dict, key: str, where: str, default: int, low: int = 1) -> int:
    value = body.get(key, default)
    if not _whole(value, low):
        raise UserError(f"{where}: '{key}' must be a whole number from {low}, got {shown(value)}")
    return value


def device_map(body: dict, where: str) -> str | dict:
    """accelerate's device_map: a device ("auto", "cpu", "cuda:0", 0), or module names → such devices."""
    value = body.get("device_map", "auto")
    device = (str, int)
    if isinstance(value, bool) or not (isinstance(value, device) or (
            isinstance(value, dict) and all(isinstance(v, device) and not isinstance(v, bool) for v in value.values()))):
        raise UserError(f"{where}: 'device_map' must be a device or a mapping of modules to devices, got {shown(value)}")
    return value


# --- calibration profiles ------------------------------------------------------------------------


def required(body: dict, key: str, where: str):
    if key not in body:
        raise UserError(f"{where}: '{key}' is missing; {RECALIBRATE}")
    return body[key]


def k_field(body: dict, key: str, where: str, default: int | None = None) -> int:
    value = body.get(key, default) if default is not None else required(body, key, where)
    if not _whole(value, 0, MAX_K):
        raise UserError(f"{where}: '{key}' must be a whole number from 0 to {MAX_K}, got {shown(value)}")
    return int(value)


def number(body: dict, key: str, where: str, default: float | None = None, low: float = 0.0,
           high: float = math.inf) -> float:
    """A finite number from ``low`` to ``high`` (YAML's true is an int, and is refused)."""
    value = body.get(key, default) if default is not None else required(body, key, where)
    if not _finite(value) or not low <= value <= high:
        bounds = f"from {low:g} to {high:g}" if high < math.inf else f"of at least {low:g}"
        raise UserError(f"{where}: '{key}' must be a number {bounds}, got {shown(value)}")
    return float(value)


def costs(body: dict, where: str) -> dict[int, float]:
    """``verify_cost``: K → the cost of a (K+1)-token forward in one-token forwards, each positive."""
    value = body.get("verify_cost")
    value = {} if value is None else value
    if not isinstance(value, dict) or not all(
            _whole(k, 0) and _finite(v) and v > 0 for k, v in value.items()):
        raise UserError(f"{where}: 'verify_cost' must map each K to a positive number, got {shown(value)}")
    return {int(k): float(v) for k, v in value.items()}


def choice(body: dict, key: str, where: str, choices: tuple[str, ...], default: str) -> str:
    value = body.get(key, default)
    if value not in choices:
        raise UserError(f"{where}: '{key}' must be one of {', '.join(choices)}, got {shown(value)}")
    return value


def mapping(body: dict, key: str, where: str) -> dict:
    """An optional mapping (versions, settings, drafter, computed_by): absent is empty, anything else is refused."""
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"{where}: '{key}' must be a mapping, got {shown(value)}")
    return value


def string(body: dict, key: str, where: str, default: str = "") -> str:
    value = body.get(key, default)
    if not isinstance(value, str):
        raise UserError(f"{where}: '{key}' must be a string, got {shown(value)}")
    return str(value)
