"""A store's answers file, and its table: built once, kept in specdec's cache, and walked.

The table holds, for every n-gram of MIN_MATCH to MAX_MATCH tokens of the answers, a 64-bit hash,
sorted, with the successor seen most often after it (ties: the smallest id) and that successor's
share of its count. How n-grams are hashed is the table's format: building (``window_hashes``) and
looking up (``suffix_hashes``) are kept together here, beside the kept table's FORMAT.

The answers file is JSON lines, gzip-compressed when its name ends in ``.gz``: one object per answer,
``{"ids": [token ids…], "start": N}``, where the answer begins at ``ids[N]`` and what comes before is
the prompt (``start`` may be left out: all of it is answer). It is what examples/make_answers.py
writes, so a user can make one for any target from its own answers. Only the last MAX_MATCH tokens
before an answer are indexed, as leads into it.

Reading it is a user's file and is checked: a missing, unreadable or damaged file, or a token id
outside the target's vocabulary, is one line naming the file and the line, before any prompt runs.
The table (``build_table``: seconds for half a million tokens) is kept under ``stores/`` in the cache,
keyed by the file's bytes, the n-gram lengths and the target's vocabulary size, written whole or not at all (runtime/staging.py),
and mapped at later starts (a few milliseconds, its successors checked). A kept table that does not load,
or whose successors are not the target's token ids, is built again with one warning.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import UserError, loads
from ...notices import log
from ...pairs.cache_dir import open_cache, unwritable
from ...runtime import staging
from .suffix import MAX_MATCH, MIN_MATCH, MIN_PROBABILITY, SPEC_FACTOR

FORMAT = 1  # of the kept table; a change of it, or of the n-gram lengths, keys a new table
PARTS = ("keys", "successors", "shares")
PRIME = 0x100000001B3  # FNV-1a's 64-bit prime; the hash is polynomial in it, over (n, tokens + 1)
MASK = (1 << 64) - 1


@dataclass(frozen=True)
class Table:
    """Sorted n-gram hashes, each with its likeliest successor and that successor's share."""

    keys: np.ndarray  # uint64, sorted
    successors: np.ndarray  # int32
    shares: np.ndarray  # float32

    def longest(self, tail: list[int]) -> tuple[int, int]:
        """(row, n): the longest n-gram ending ``tail`` that the table knows; (-1, 0) for none."""
        hashes = suffix_hashes(tail)
        if not hashes:
            return -1, 0
        rows = np.searchsorted(self.keys, np.array(hashes, dtype=np.uint64)).tolist()
        keys = len(self.keys)
        for n, h, row in zip(range(MIN_MATCH + len(hashes) - 1, MIN_MATCH - 1, -1), hashes, rows):
            if row < keys and int(self.keys[row]) == h:
                return row, n
        return -1, 0

    def continuation(self, tail: list[int], k: int, factor: float = SPEC_FACTOR,
                     floor: float = MIN_PROBABILITY) -> tuple[list[int], int]:
        """Up to ``k`` tokens after ``tail`` and the first match's length (suffix.continuation's rule:
        no longer than ``factor`` times the match, while the product of shares stays ≥ ``floor``)."""
        row, matched = self.longest(tail)
        limit = min(k, int(factor * matched))
        found, chance, tail = [], 1.0, list(tail)
        while len(found) < limit and row >= 0:
            chance *= float(self.shares[row])
            if chance < floor:
                break
            found.append(int(self.successors[row]))
            tail.append(found[-1])
            row, _ = self.longest(tail[-MAX_MATCH:])
        return found, matched


def suffix_hashes(tail: list[int]) -> list[int]:
    """The hash of each n-gram ending ``tail``, as window_hashes makes it, the longest first (MAX_MATCH
    down to MIN_MATCH tokens, as many as it holds). window_hashes' n-gram hash is n·Pⁿ plus the sum of
    (token + 1)·Pᵈ over the tokens' distances d from its end, so one pass from the tail's end makes
    each from the one before and one more term (every drafted token looks a tail up)."""
    found, total, power = [], 0, 1
    for n, token in enumerate(reversed(tail[-MAX_MATCH:]), 1):
        total = (total + (token + 1) * power) & MASK
        power = (power * PRIME) & MASK
        if n >= MIN_MATCH:
            found.append((n * power + total) & MASK)
    return found[::-1]


def window_hashes(tokens: np.ndarray, n: int, ends: np.ndarray) -> np.ndarray:
    """The hash of tokens[end - n:end] for each end (uint64 arithmetic wraps as MASK does)."""
    h = np.full(ends.shape, n, dtype=np.uint64)
    for j in range(n):
        h = h * np.uint64(PRIME) + tokens[ends - n + j].astype(np.uint64) + np.uint64(1)
    return h


def build_table(answers: list[tuple[list[int], int]]) -> Table:
    """The table of every n-gram → next-token pair of the answers, each given as (tokens, lead): the
    first ``lead`` tokens only lead into the answer (a template's header), as the memory counts them."""
    keys, nexts = [], []
    for tokens, lead in answers:
        array = np.asarray(tokens, dtype=np.int64)
        for n in range(MIN_MATCH, MAX_MATCH + 1):
            ends = np.arange(max(lead, 1, n), len(array))
            keys.append(window_hashes(array, n, ends))
            nexts.append(array[ends])
    if not keys or not sum(map(len, keys)):
        return Table(np.empty(0, np.uint64), np.empty(0, np.int32), np.empty(0, np.float32))
    keys, nexts = np.concatenate(keys), np.concatenate(nexts)
    order = np.lexsort((nexts, keys))
    keys, nexts = keys[order], nexts[order]
    pair_start = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]) | (nexts[1:] != nexts[:-1])])
    pair_count = np.diff(np.r_[pair_start, len(keys)])
    pair_key, pair_next = keys[pair_start], nexts[pair_start]
    key_start = np.flatnonzero(np.r_[True, pair_key[1:] != pair_key[:-1]])
    totals = np.add.reduceat(pair_count, key_start)
    group = np.repeat(np.arange(len(key_start)), np.diff(np.r_[key_start, len(pair_key)]))
    best = np.lexsort((-pair_count, group))[key_start]  # each key's largest count; ties: the smallest id
    return Table(pair_key[key_start], pair_next[best].astype(np.int32), (pair_count[best] / totals).astype(np.float32))


def opened_table(path: Path, vocab_size: int) -> Table:
    """The table of the answers in ``path``, from the cache when it holds it, else built (and kept)."""
    data = read_bytes(path)
    # the vocabulary too: a table is kept only for the targets whose ids its answers were checked against
    key = hashlib.sha256(f"{FORMAT}|{MIN_MATCH}|{MAX_MATCH}|{vocab_size}|".encode() + data).hexdigest()[:16]
    root = open_cache() / "stores"
    entry = root / key
    table = kept_table(entry, vocab_size)
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


def kept_table(entry: Path, vocab_size: int) -> Table | None:
    """The table kept in ``entry``, mapped; None when none is kept, or when the kept one is damaged
    (then with one warning, as the cache's other damaged entries: it is built again)."""
    if not entry.is_dir():
        return None
    try:
        table = Table(*(np.load(entry / f"{part}.npy", mmap_mode="r") for part in PARTS))
        damage = table_damage(table, vocab_size)
    except (OSError, EOFError, ValueError) as exc:
        damage = f"{type(exc).__name__}: {exc}"
    if damage is None:
        return table
    log.warning(f"the store's kept table {entry} is damaged ({damage}); building it again")
    return None


DTYPES = {"keys": np.uint64, "successors": np.int32, "shares": np.float32}  # as build_table makes them


def table_damage(table: Table, vocab_size: int) -> str | None:
    """What is wrong with a kept table (one clause), or None. Its parts are columns of build_table's
    dtypes and of one length, and every successor is one of the target's token ids: a draft outside
    the vocabulary would stop generate mid-answer (an IndexError in the target's embedding). Reading
    the successors once costs a few milliseconds for half a million answer tokens."""
    for part, dtype in DTYPES.items():
        column = getattr(table, part)
        if column.ndim != 1 or column.dtype != dtype:
            return f"its {part} are {column.dtype} of shape {column.shape}, not a column of {np.dtype(dtype)}"
    if not len(table.keys) == len(table.successors) == len(table.shares):
        return "its parts differ in length"
    if len(table.successors) and not 0 <= int(table.successors.min()) <= int(table.successors.max()) < vocab_size:
        return f"successors outside the target's vocabulary (0 to {vocab_size - 1})"
    return None


# The answers a store may hold, as JSON text: far above any store a 2-core index would be built from,
# and a bound on what a small gzip file may inflate to (a "zip bomb" would otherwise fill the memory).
MAX_ANSWERS_BYTES = 2 * 1024**3


def read_bytes(path: Path) -> bytes:
    """The answers file's bytes, as stored (compressed or not); a file that cannot be read is one line."""
    try:
        size = Path(path).stat().st_size
        if size > MAX_ANSWERS_BYTES:
            raise UserError(f"store {path}: {size:,} bytes; a store holds at most {MAX_ANSWERS_BYTES:,}")
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise UserError(f"store {path}: not found; name a file of the target's answers (JSON lines of ids and start)") from None
    except IsADirectoryError:
        raise UserError(f"store {path}: is a directory; name the answers file in it") from None
    except OSError as exc:
        raise UserError(f"store {path}: cannot be read ({exc.strerror or exc})") from None


def inflated(path: Path, data: bytes) -> bytes:
    """A gzip file's content, member after member, refused once it passes MAX_ANSWERS_BYTES: inflated
    in bounded steps, so a bomb costs the bound, not what it would inflate to."""
    out, rest = bytearray(), data
    while rest:
        if rest[:2] != b"\x1f\x8b":  # as gzip's own reader says it
            raise gzip.BadGzipFile(f"Not a gzipped file ({bytes(rest[:2])!r})")
        member = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip's header and trailer
        out += member.decompress(rest, MAX_ANSWERS_BYTES + 1 - len(out))
        if len(out) > MAX_ANSWERS_BYTES or member.unconsumed_tail:
            raise UserError(f"store {path}: inflates past {MAX_ANSWERS_BYTES:,} bytes; a store holds at most that")
        if not member.eof:
            raise EOFError("the compressed file ends before its end-of-stream marker")
        rest = member.unused_data
    return bytes(out)


def parse_answers(path: Path, data: bytes, vocab_size: int) -> list[tuple[list[int], int]]:
    """Each answer as (its tokens from MAX_MATCH before its start, how many of them lead into it)."""
    try:
        text = (inflated(path, data) if str(path).endswith(".gz") else data).decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:  # a bad header, a cut or a corrupt body
        kind = "zlib" if isinstance(exc, zlib.error) else type(exc).__name__  # zlib's class is named "error"
        raise UserError(f"store {path}: damaged ({kind}: {exc}); write it again") from None
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
        record = loads(line)
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
