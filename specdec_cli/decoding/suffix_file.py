"""The suffix memory kept between runs (`generate --memory PATH`).

Opt-in, since it keeps the token ids of earlier answers: text a user may not want kept. One JSON
object, ``{"format": 1, "target": <the target's identity>, "answers": [[lead, [ids…]], …]}``, oldest
first, at most the memory's bound in tokens (suffix.MEMORY_TOKENS, ~150 kB of JSON). A memory only
drafts, and every draft is judged by the target, so no file, good or bad, changes the output.

Reading: a missing file is an empty memory (a first run); a truncated or corrupt one gives one
warning, an empty memory, and is replaced at the end; another target's gives one warning and is left
as it is (its answers tokenise another vocabulary, or another model wrote them). Writing: under the
directory's lock (atomic.updating) the file is read again, this run's new answers are added after
what it holds, the oldest are dropped past the bound, and the file is replaced atomically: two
processes sharing one file both keep their answers.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..atomic import updating, write_atomically
from .suffix import SuffixDrafter

FORMAT = 1


class MemoryFile:
    """One run's link between a SuffixDrafter and its file."""

    def __init__(self, path: str | Path, identity: dict, memory: SuffixDrafter):
        self.path, self.identity, self.memory = Path(path), identity, memory
        self.foreign = False
        self.loaded = 0  # the memory's answer count once the file was read: what came after is this run's

    def load(self) -> str | None:
        """Fill the memory from the file; a warning line when the file could not be used."""
        answers, problem = read(self.path, self.identity, self.memory.vocab_limit)
        self.foreign = problem is not None and problem.startswith("another target")
        for tokens, lead in answers:
            self.memory.remember(tokens, lead)
        self.loaded = self.memory.remembered
        if problem is None:
            return None
        then = "left as it is" if self.foreign else "replaced at the end"
        return f"--memory {self.path}: {problem}; starting with an empty memory (the file is {then})"

    def save(self) -> None:
        """Add this run's answers to what the file holds now, within the bound."""
        new = min(self.memory.remembered - self.loaded, len(self.memory.answers))
        if self.foreign or new <= 0:
            return
        ours = list(self.memory.answers)[-new:]
        with updating(self.path) as path:
            theirs, problem = read(path, self.identity, self.memory.vocab_limit)
            if problem is not None and problem.startswith("another target"):
                return  # written by another target since this run began: left as it is
            kept = bounded(theirs + ours, self.memory.memory_tokens)
            text = json.dumps({"format": FORMAT, "target": self.identity, "answers": [[lead, tokens] for tokens, lead in kept]},
                              separators=(",", ":"))
            write_atomically(path, text + "\n")


def read(path: Path, identity: dict, vocab: int | None) -> tuple[list[tuple[list[int], int]], str | None]:
    """The answers a memory file holds, as (tokens, lead), and why none could be used (None: fine)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [], None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return [], f"cannot be read ({type(error).__name__}: {error})"
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return [], f"not a specdec memory file of format {FORMAT}"
    if data.get("target") != identity:
        return [], f"another target's memory ({json.dumps(data.get('target'))})"
    answers = data.get("answers")
    if not isinstance(answers, list) or not all(valid(entry, vocab) for entry in answers):
        return [], "its answers are damaged"
    return [(tokens, lead) for lead, tokens in answers], None


def valid(entry, vocab: int | None) -> bool:
    """``[lead, [ids…]]`` with 0 ≤ lead < len(ids) and every id in the vocabulary."""
    if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
        return False
    lead, tokens = entry
    return (type(lead) is int and 0 <= lead < len(tokens)
            and all(type(t) is int and 0 <= t and (vocab is None or t < vocab) for t in tokens))


def bounded(answers: list[tuple[list[int], int]], limit: int) -> list[tuple[list[int], int]]:
    """The newest answers whose tokens fit in ``limit`` (the newest one always)."""
    kept, size = [], 0
    for tokens, lead in reversed(answers):
        if kept and size + len(tokens) > limit:
            break
        kept.append((tokens, lead))
        size += len(tokens)
    return kept[::-1]
