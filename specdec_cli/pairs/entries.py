"""models.yaml's values checked one by one. A misspelt key would be ignored without a word and its
setting lost; a value of the wrong type would surface later as a traceback far from the file. Each
is one UserError instead, naming where in the file (``where``: the file, the pair and the key's path)."""

from __future__ import annotations

from ..errors import UserError
from ..limits import MAX_K


def known_keys(mapping: dict, known: tuple[str, ...], where: str) -> None:
    unknown = sorted(str(key) for key in mapping if key not in known)
    if unknown:
        raise UserError(f"{where}: unknown key {unknown[0]!r}; the keys are {', '.join(known)}")


def k_value(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_K:  # YAML's true is an int
        raise UserError(f"{where}: K must be an integer from 0 to {MAX_K}, got {value!r}")
    return value


def flag(body: dict, key: str, where: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise UserError(f"{where}: '{key}' is true or false, got {value!r}")
    return value


def text(body: dict, key: str, where: str, default: str | None = None, what: str = "a string") -> str | None:
    """A string value (YAML would hand a list or a mapping on to str() without a word)."""
    value = body.get(key, default)
    if value is not None and not isinstance(value, str):
        raise UserError(f"{where}: '{key}' must be {what}, got {value!r}")
    return value


def whole_number(body: dict, key: str, where: str, default: int, low: int = 1) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UserError(f"{where}: '{key}' must be a whole number from {low}, got {value!r}")
    return value


def device_map(body: dict, where: str) -> str | dict:
    """accelerate's device_map: a device ("auto", "cpu", "cuda:0", 0), or module names → such devices."""
    value = body.get("device_map", "auto")
    device = (str, int)
    if isinstance(value, bool) or not (isinstance(value, device) or (
            isinstance(value, dict) and all(isinstance(v, device) and not isinstance(v, bool) for v in value.values()))):
        raise UserError(f"{where}: 'device_map' must be a device or a mapping of modules to devices, got {value!r}")
    return value
