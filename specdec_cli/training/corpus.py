"""The target's answers kept as token ids in shards, so the teacher pass can be recomputed without
asking the target again (generation is the dear part of the data), and the filters for the
requests the target writes itself.

A shard is a gzipped JSON-lines file, one answer per line: ``{"id", "kind", "ids", "start"}`` with
``ids`` the prompt and answer tokens and ``start`` where the answer begins. A shard is written once,
atomically, so a run that stops mid-way resumes at the first missing one.
"""

from __future__ import annotations

import gzip
import json
import re
import time
from pathlib import Path
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")

SHARD = "shard-{:05d}.jsonl.gz"


def shard_path(directory: Path, index: int) -> Path:
    return Path(directory) / SHARD.format(index)


def write_shard(path: Path, rows: list[dict]) -> None:
    body = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows).encode()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".partial")
    staging.write_bytes(gzip.compress(body, mtime=0))
    staging.replace(path)


def read_shard(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def read_shards(directory: Path) -> list[dict]:
    """Every answer of every shard in ``directory``, in shard order."""
    return [row for path in sorted(Path(directory).glob("shard-*.jsonl.gz")) for row in read_shard(path)]


def within_budget(todo: Iterable[T], minutes: float) -> Iterator[T]:
    """The pieces of work, one by one, while the next one (as long as the longest so far, plus a
    margin) would still end inside the budget: a resumable stage then stops cleanly, to be rerun."""
    started, longest = time.monotonic(), 0.0
    for item in todo:
        if time.monotonic() - started + 1.2 * longest > 60 * minutes:
            print("budget spent; rerun to continue", flush=True)
            return
        began = time.monotonic()
        yield item
        longest = max(longest, time.monotonic() - began)


def clean_request(text: str, low: int = 20, high: int = 600) -> str | None:
    """A request the target wrote, tidied (quotes, labels, trailing chatter cut), or None if unusable."""
    text = text.strip()
    text = re.sub(r"^(request|question|prompt|user|message|task)\s*[:\-]\s*", "", text, flags=re.I).strip()
    if len(text) >= 2 and text[0] in "\"'“" and text[-1] in "\"'”":
        text = text[1:-1].strip()
    if not low <= len(text) <= high:
        return None
    if text.lower().startswith(("i'm sorry", "sorry", "as an ai", "i cannot", "i can't")):
        return None
    return text


def dedup_key(text: str) -> str:
    """Requests that differ only in case, spacing or punctuation count as one."""
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())[:80]


def dedupe(texts: list[str], seen: set[str] | None = None) -> list[str]:
    seen = set() if seen is None else seen
    kept = []
    for text in texts:
        key = dedup_key(text)
        if key and key not in seen:
            seen.add(key)
            kept.append(text)
    return kept


def phrases(text: str, n: int = 6) -> set[tuple[str, ...]]:
    """The text's runs of ``n`` words, case and punctuation aside: two prompts that share one share
    wording, not just a topic (a common five-word run like "what is the difference between" is
    frequent enough in plain English; six-word runs shared by chance are rare)."""
    words = re.sub(r"[^\w\s]", " ", text.lower()).split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def sharing_phrases(texts: Iterable[str], held_out: Iterable[str], n: int = 6) -> list[str]:
    """The texts that share an ``n``-word run with any held-out text: a training prompt must share none
    with a prompt file that a drafter is judged on."""
    judged = set().union(*(phrases(text, n) for text in held_out))
    return [text for text in texts if phrases(text, n) & judged]


FOLLOW_UP = ("Here is a message someone sent to an assistant, and the assistant's reply.\n\nMessage: {question}\n\n"
             "Reply: {answer}\n\nWrite the next short message the person sends: a follow-up question or request "
             "about the reply. Reply with the message only.")


def finished_turns(answers: list[dict], ids: set[str], eos: int, longest: int = 400) -> list[dict]:
    """Greedy answers to the prompts in ``ids`` that ended on ``eos`` within ``longest`` tokens in all:
    the first turns of conversations (a reply cut off by the length limit is not one a user answers)."""
    return [row for row in answers if row["kind"] == "greedy" and row["id"] in ids and row["ids"][-1] == eos
            and len(row["ids"]) <= longest]
