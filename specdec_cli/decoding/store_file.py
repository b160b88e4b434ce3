"""A store's answers file, and its table built once and kept in specdec's cache.

The answers file is JSON lines, gzip-compressed when its name ends in ``.gz``: one object per answer,
``{"ids": [token ids…], "start": N}``, where the answer begins at ``ids[N]`` and what comes before is
the prompt (``start`` may be left out: all of it is answer). It is what examples/make_answers.py
writes, so a user can make one for any target from its own answers. Only the last MAX_MATCH tokens
before an answer are indexed, as leads into it.

Reading it is a user's file and is checked: a missing, unreadable or damaged file, or a token id
outside the target's vocabulary, is one line naming the file and the line, before any prompt runs.
The table (store.build_table: 2.5 s for half a million tokens) is kept under ``stores/`` in the cache,
keyed by the file's bytes, the n-gram lengths and the target's vocabulary size, written whole or not at all (runtime/staging.py),
and mapped at later starts (under a millisecond). A kept table that does not load is built again.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..notices import log
from ..pairs.cache_dir import open_cache, unwritable
from ..runtime import staging
from .store import MAX_MATCH, MIN_MATCH, Table, build_table

FORMAT = 1  # of the kept table; a change of it, or of the n-gram lengths, keys a new table
PARTS = ("keys", "successors", "shares")


def opened_table(path: Path, vocab_size: int) -> Table:
    """The table of the answers in ``path``, from the cache when it holds it, else built (and kept)."""
    data = read_bytes(path)
    # the vocabulary too: a table is kept only for the targets whose ids its answers were checked against
    key = hashlib.sha256(f"{FORMAT}|{MIN_MATCH}|{MAX_MATCH}|{vocab_size}|".encode() + data).hexdigest()[:16]
    root = open_cache() / "stores"
    entry = root / key
    table = kept_table(entry)
    if table is not None:
        return table
    shutil.rmtree(entry, ignore_errors=True)  # none kept yet, or one damaged: built again
    answers = parse_answers(path, data, vocab_size)
    log.info(f"indexing the store's {sum(len(t) - lead for t, lead in answers):,} answer tokens (once: kept in {root})")
    table = build_table(answers)
    try:
        with staging.staging(root) as scratch:
            for part in PARTS:
                np.save(scratch / f"{part}.npy", getattr(table, part))
            os.replace(scratch, entry)
    except OSError as exc:  # read-only, full, or another process kept the same table first
        if not entry.is_dir():
            log.warning(f"the store's table is not kept, so it is built again at every start: {unwritable(entry, exc)}")
    return table


def kept_table(entry: Path) -> Table | None:
    """The table kept in ``entry``, mapped; None when there is none or its parts do not fit together."""
    try:
        table = Table(*(np.load(entry / f"{part}.npy", mmap_mode="r") for part in PARTS))
    except (OSError, ValueError):
        return None
    return table if len(table.keys) == len(table.successors) == len(table.shares) else None


def read_bytes(path: Path) -> bytes:
    """The answers file's bytes, as stored (compressed or not); a file that cannot be read is one line."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"store {path}: not found; name a file of the target's answers (JSON lines of ids and start)") from None
    except IsADirectoryError:
        raise UserError(f"store {path}: is a directory; name the answers file in it") from None
    except OSError as exc:
        raise UserError(f"store {path}: cannot be read ({exc.strerror or exc})") from None


def parse_answers(path: Path, data: bytes, vocab_size: int) -> list[tuple[list[int], int]]:
    """Each answer as (its tokens from MAX_MATCH before its start, how many of them lead into it)."""
    try:
        text = (gzip.decompress(data) if str(path).endswith(".gz") else data).decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise UserError(f"store {path}: damaged ({type(exc).__name__}: {exc}); write it again") from None
    answers = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            ids, start = answer_fields(line, vocab_size)
        except ValueError as problem:
            raise UserError(f"store {path}, line {number}: {problem}") from None
        lead = max(start - MAX_MATCH, 0)
        answers.append((ids[lead:], start - lead))
    if not answers:
        raise UserError(f"store {path}: holds no answers")
    return answers


def answer_fields(line: str, vocab_size: int) -> tuple[list[int], int]:
    """(ids, start) of one line; ValueError saying what is wrong with it."""
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    ids = record.get("ids") if isinstance(record, dict) else None
    start = record.get("start", 0) if isinstance(record, dict) else None
    if not (isinstance(ids, list) and all(type(t) is int for t in ids)):
        raise ValueError("expected an object whose 'ids' lists token ids")
    if not (type(start) is int and 0 <= start < len(ids)):
        raise ValueError(f"'start' must be a position in 'ids' (0 to {len(ids) - 1}), got {start!r}")
    outside = next((t for t in ids if not 0 <= t < vocab_size), None)
    if outside is not None:
        raise ValueError(f"token id {outside} is outside the target's vocabulary (0 to {vocab_size - 1}): another tokenizer's answers?")
    return ids, start
