"""The suffix memory kept between runs (`generate --memory PATH`).

Opt-in, since it keeps the token ids of earlier answers: text a user may not want kept, so the file is
written 0600. One JSON object, ``{"format": 1, "target": <the target's identity>, "answers": [[lead,
[ids…]], …]}``, oldest first, at most the memory's bound in tokens (limits.MEMORY_TOKENS, ~150 kB of
JSON; an answer longer than the bound is cut to it). A memory only drafts, and every draft is judged
by the target, so no file, good or bad, changes the output.

Only what specdec writes is replaced. Before any model loads (``recognise``, through
atomic.check_writable), a file that is neither empty nor a memory file (a JSON object of format 1 with
its target and answers) is refused and left alone: a notes file, a config, the prompts being read, a
file past ``max_bytes``, or a truncated copy (specdec writes atomically and never leaves one half-written,
so whose it was no one can tell). Reading: a missing or empty file is an empty memory (a first
run); one that is ours but damaged (ids past the vocabulary, a lead past its answer) gives one warning,
an empty memory, and is replaced at the end; another target's gives one warning and is left as it is
(its answers tokenise another vocabulary, or another model wrote them); one holding more tokens than
the memory keeps gives one warning and only its newest answers are used. Writing: under the
directory's lock (atomic.updating) the file is read again, this run's new answers are added after what
it holds, the oldest are dropped past the bound, and the file is replaced atomically: two processes
sharing one file both keep their answers. A file that is no longer ours by then is left alone, and the
write fails (one error line, exit 3).
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ...atomic import read_at_most, updating, write_atomically
from ...errors import UserError, loads
from ...limits import MEMORY_TOKENS

if TYPE_CHECKING:  # suffix.py imports torch, and the file is checked before torch loads
    from .suffix import SuffixDrafter

FORMAT = 1
MODE = 0o600  # the user's answers: theirs to read alone
KEYS = {"format", "target", "answers"}


def max_bytes(tokens: int = MEMORY_TOKENS) -> int:
    """The most a memory file of ``tokens`` answer tokens takes: an id is at most 7 digits and its comma
    (vocabularies run to ~260k), and an answer (a lead and at least one token) adds at most 8 bytes of
    brackets and lead, ≤ 4 a token: 12, rounded up to 16; plus 64 KiB for the target's identity. A file
    past it is not one specdec wrote, and is not read: indexing a file far past the bound stalls the
    start and takes far more memory than the bound allows (docs/notebook.md, "Figures that were in
    the code's docstrings")."""
    return 16 * tokens + 64 * 1024


class MemoryFile:
    """One run's link between a SuffixDrafter and its file."""

    def __init__(self, path: str | Path, identity: dict, memory: SuffixDrafter):
        self.path, self.identity, self.memory = Path(path), identity, memory
        self.foreign = False  # left as it is: another target's, or (since it was checked) not a memory file
        self.loaded = 0  # the memory's answer count once the file was read: what came after is this run's
        self.saved = 0  # answers save() added to the file

    def load(self) -> str | None:
        """Fill the memory from the file; a warning line when the file could not be used, or not all of it."""
        answers, problem, self.foreign = read(self.path, self.identity, self.memory.vocab_limit,
                                              max_bytes(self.memory.memory_tokens))
        kept = bounded(answers, self.memory.memory_tokens)
        for tokens, lead in kept:
            self.memory.remember(tokens, lead)
        self.loaded = self.memory.remembered
        if problem is not None:
            then = "left as it is" if self.foreign else "replaced at the end"
            return f"--memory {self.path}: {problem}; starting with an empty memory (the file is {then})"
        if kept != answers:
            size = sum(len(tokens) for tokens, _ in answers)
            return (f"--memory {self.path}: holds {size:,} tokens, more than the memory keeps "
                    f"({self.memory.memory_tokens:,}); using its newest answers (the rest go when it is next written)")
        return None

    def save(self) -> None:
        """Add this run's answers to what the file holds now, within the bound; ``saved`` says how many."""
        new = min(self.memory.remembered - self.loaded, len(self.memory.answers))
        if self.foreign or new <= 0:
            return
        ours = list(self.memory.answers)[-new:]
        with updating(self.path) as path:
            theirs, problem, leave = read(path, self.identity, self.memory.vocab_limit,
                                          max_bytes(self.memory.memory_tokens))
            if leave and problem.startswith("another target"):
                return  # written by another target since this run began: left as it is
            if leave:
                raise OSError(errno.EEXIST, f"it {problem} now, so it is left alone")
            kept = bounded(theirs + ours, self.memory.memory_tokens)
            text = json.dumps({"format": FORMAT, "target": self.identity, "answers": [[lead, tokens] for tokens, lead in kept]},
                              separators=(",", ":"))
            write_atomically(path, text + "\n", mode=MODE)
        self.saved = new


def recognise(path: Path) -> bool:
    """Whether ``path`` (an existing, non-empty file) is a memory file, read within ``max_bytes``: what
    atomic.check_writable asks before --memory may replace it. A UserError says why for a file too large."""
    data, size = read_at_most(path, max_bytes())
    if data is None:
        raise UserError(f"--memory {path}: {size:,} bytes, more than a memory file holds ({max_bytes():,}): not a "
                        "file specdec wrote, so it is left alone; give another name or delete it")
    return not data.strip() or _parsed(data) is not None


def read(path: Path, identity: dict, vocab: int | None, limit: int | None = None
         ) -> tuple[list[tuple[list[int], int]], str | None, bool]:
    """The answers a memory file holds, as (tokens, lead); why none could be used (None: fine); and
    whether the file is to be left as it is (another target's, or not a memory file at all)."""
    try:
        data, size = read_at_most(path, limit or max_bytes())
    except FileNotFoundError:
        return [], None, False
    except OSError as error:
        return [], f"cannot be read ({error.strerror or error})", True
    if data is None:
        return [], f"is {size:,} bytes, more than a memory file holds", True
    if not data.strip():
        return [], None, False  # empty: a first run, as a missing file is
    memory = _parsed(data)
    if memory is None:
        return [], f"is not a specdec memory file of format {FORMAT}", True
    if memory["target"] != identity:
        return [], f"another target's memory ({json.dumps(memory['target'])})", True
    answers = memory["answers"]
    if not isinstance(answers, list) or not all(valid(entry, vocab) for entry in answers):
        return [], "its answers are damaged", False
    return [(tokens, lead) for lead, tokens in answers], None, False


def _parsed(data: bytes) -> dict | None:
    """The JSON object of a memory file (format 1, a target, answers), or None for anything else."""
    try:
        memory = loads(data.decode("utf-8"), max_chars=None)  # bounded in bytes already
    except (UnicodeDecodeError, ValueError):  # ValueError: not JSON, or nested past the parser's reach
        return None
    ok = isinstance(memory, dict) and KEYS <= memory.keys() and type(memory["format"]) is int and memory["format"] == FORMAT
    return memory if ok else None


def valid(entry, vocab: int | None) -> bool:
    """``[lead, [ids…]]`` with 0 ≤ lead < len(ids) and every id in the vocabulary."""
    if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
        return False
    lead, tokens = entry
    return (type(lead) is int and 0 <= lead < len(tokens)
            and all(type(t) is int and 0 <= t and (vocab is None or t < vocab) for t in tokens))


def bounded(answers: list[tuple[list[int], int]], limit: int) -> list[tuple[list[int], int]]:
    """The newest answers whose tokens fit in ``limit``; the newest one always, cut to ``limit`` tokens
    where it is longer, so that a file never holds more than its bound (max_bytes)."""
    kept, size = [], 0
    for tokens, lead in reversed(answers):
        if kept and size + len(tokens) > limit:
            break
        if len(tokens) > limit:
            tokens = tokens[: max(limit, lead + 1)]
        kept.append((tokens, lead))
        size += len(tokens)
    return kept[::-1]
