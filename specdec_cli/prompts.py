"""Prompts from the command line, a file or standard input.

Each non-blank line is one prompt: plain text, or a JSON object with ``prompt`` and optional
``id`` and ``scenario`` (a line whose first character is ``{`` is read as JSON), and ``answer`` for a
task whose output can be checked (measure/tasks.py).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from .errors import PromptTooLong, UserError


@dataclass(frozen=True)
class Prompt:
    id: str | int
    text: str
    scenario: str | None = None
    answer: str | None = None
    where: str | None = None  # its line, "stdin line 4", where it came from a file or a pipe

    @property
    def label(self) -> str:
        """How messages name it: "prompt 3 (stdin line 4)", or "prompt 1" for the command line's."""
        return f"prompt {self.id}" + (f" ({self.where})" if self.where else "")


def parse_lines(lines: Iterable[str], origin: str = "stdin") -> Iterator[Prompt]:
    """Prompts one at a time, so a long-running pipe is served as it arrives."""
    count = 0
    for number, line in enumerate(_text(lines, origin), start=1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        count += 1
        if line.lstrip().startswith("{"):
            yield _from_json(line, number, origin, count)
        else:
            yield Prompt(count, line, where=f"{origin} line {number}")
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
        raise UserError(f"{prompt.label}: {exc}") from None


def check_fit(prompts: Sequence[Prompt], encoded: Sequence[Sequence[int]], context: int | None) -> None:
    """Every prompt fits the target's context, checked before any is run: a bench or a sweep that
    met a long prompt in the middle would lose what it had measured."""
    for prompt, ids in zip(prompts, encoded):
        with named(prompt):
            PromptTooLong.check(len(ids), context)


def _from_json(line: str, number: int, origin: str, count: int) -> Prompt:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UserError(f"{origin} line {number}: malformed JSON ({exc.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get("prompt"), str) or not record["prompt"].strip():
        raise UserError(f"{origin} line {number}: a JSON prompt line needs a non-empty string field 'prompt'")
    scenario, answer = record.get("scenario"), record.get("answer")
    return Prompt(record.get("id", count), record["prompt"], None if scenario is None else str(scenario),
                  None if answer is None else str(answer), f"{origin} line {number}")
