"""Prompts from the command line, a file or standard input.

Each non-blank line is one prompt: plain text, or a JSON object with ``prompt`` and optional
``id`` and ``scenario`` (a line whose first character is ``{`` is read as JSON), and ``answer`` for a
task whose output can be checked (measure/tasks.py). An ``id`` is a string, an integer, a finite number,
true, false or null: it is written back in JSON results, where NaN, Infinity, lists and objects have no
place (a list or object could also be no one's idea of a name).

A line that is no prompt, and a prompt the target's context cannot hold, are a BadPrompt: a file of
prompts (bench, calibrate-k, verify-equivalence) fails on it before anything runs; generate's stream
says it, writes its error object, and goes on to the next line (``parse_lines(..., go_on=True)``).
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from .errors import JsonTooLarge, PromptTooLong, UserError, loads


@dataclass(frozen=True)
class Prompt:
    id: str | int
    text: str
    scenario: str | None = None
    answer: str | None = None
    where: str | None = None  # its line, "stdin line 4", where it came from a file or a pipe
    line: int | None = None  # that line's number

    @property
    def label(self) -> str:
        """How messages name it: "prompt 3 (stdin line 4)", or "prompt 1" for the command line's."""
        return f"prompt {self.id}" + (f" ({self.where})" if self.where else "")


class BadPrompt(UserError):
    """One prompt that cannot be answered: its line is no prompt, or the context cannot hold it. The
    message names it and its line; ``as_json`` is the object generate's --json writes in its place."""

    def __init__(self, message: str, reason: str, id: str | int, line: int | None):
        super().__init__(message)
        self.reason, self.id, self.line = reason, id, line

    def as_json(self) -> dict:
        return {"id": self.id, "line": self.line, "error": self.reason}


def parse_lines(lines: Iterable[str], origin: str = "stdin", go_on: bool = False) -> Iterator[Prompt | BadPrompt]:
    """Prompts one at a time, so a long-running pipe is served as it arrives. A line that is no prompt
    raises its BadPrompt, or with ``go_on`` (a stream) is yielded as one, and the lines after it follow."""
    count = 0
    for number, line in enumerate(_text(lines, origin), start=1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        count += 1
        if not line.lstrip().startswith("{"):
            yield Prompt(count, line, where=f"{origin} line {number}", line=number)
            continue
        try:
            item = _from_json(line, number, origin, count)
        except BadPrompt as bad:
            if not go_on:
                raise
            item = bad
        yield item
    if count == 0:
        raise UserError(f"no prompts in {origin}")


def _text(lines: Iterable[str], origin: str) -> Iterator[str]:
    """The lines as they come. Bytes that are not UTF-8 end the input with one error line, not a
    traceback (the prompts before them have been served): a file read strictly fails as it decodes a
    block, and the shell's stdin arrives with them escaped as lone surrogates."""
    iterator, number = iter(lines), 0
    while True:
        try:
            line = next(iterator)
        except StopIteration:
            return
        except UnicodeDecodeError as exc:
            raise UserError(f"{origin} is not UTF-8 text ({exc.reason}); save it as UTF-8") from None
        number += 1
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            raise UserError(f"{origin}: line {number} is not UTF-8 text; save it as UTF-8") from None
        yield line


def read_file(path: str | Path) -> list[Prompt]:
    """The prompts of a file, read once from its start: a pipe does as well (`--prompts <(grep qa all.jsonl)`)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"prompt file {path}: is a directory; give a file")
    try:
        with path.open(encoding="utf-8") as handle:
            return list(parse_lines(handle, str(path)))
    except FileNotFoundError:
        raise UserError(f"prompt file not found: {path}") from None
    except OSError as exc:
        raise UserError(f"prompt file {path}: cannot read it: {exc.strerror or exc}") from None


@contextmanager
def named(prompt: Prompt) -> Iterator[None]:
    """An error about one prompt, raised inside, names it and its line: `prompt 3 (stdin line 4): ...`."""
    try:
        yield
    except PromptTooLong as exc:
        raise BadPrompt(f"{prompt.label}: {exc}", str(exc), prompt.id, prompt.line) from None


def check_fit(prompts: Sequence[Prompt], encoded: Sequence[Sequence[int]], context: int | None) -> None:
    """Every prompt fits the target's context, checked before any is run: a bench or a sweep that
    met a long prompt in the middle would lose what it had measured."""
    for prompt, ids in zip(prompts, encoded):
        with named(prompt):
            PromptTooLong.check(len(ids), context)


def _from_json(line: str, number: int, origin: str, count: int) -> Prompt:
    def bad(reason: str, id: str | int = count) -> BadPrompt:
        return BadPrompt(f"{origin} line {number}: {reason}", reason, id, number)

    try:
        record = loads(line)
    except json.JSONDecodeError as exc:
        raise bad(f"malformed JSON ({exc.msg})") from None
    except JsonTooLarge as exc:
        raise bad(f"JSON {exc}") from None
    except ValueError as exc:  # an integer of more digits than Python converts; the advice after ':' is Python's
        raise bad(f"malformed JSON ({str(exc).split(':')[0]})") from None
    if not isinstance(record, dict):
        raise bad("a JSON prompt line needs a non-empty string field 'prompt'")
    id = record.get("id", count)
    if isinstance(id, (list, dict)) or (isinstance(id, float) and not math.isfinite(id)):
        raise bad(f"its 'id' must be a string or a finite number, not {_kind(id)}")
    if not isinstance(record.get("prompt"), str) or not record["prompt"].strip():
        raise bad("a JSON prompt line needs a non-empty string field 'prompt'", id)
    scenario, answer = record.get("scenario"), record.get("answer")
    return Prompt(id, record["prompt"], None if scenario is None else str(scenario),
                  None if answer is None else str(answer), f"{origin} line {number}", number)


def _kind(value) -> str:
    """What a refused id is, in JSON's words (1e309 reads as infinity)."""
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else "an infinite number"
    return "a list" if isinstance(value, list) else "an object"
