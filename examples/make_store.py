"""Writes the default pair's store: specdec_cli/trained/smollm2-135m-answers.jsonl.gz, the int4
target's greedy answers in examples/answers/ (make_answers.py), none of them to a bench prompt.

    python examples/make_store.py

Each line keeps an answer's ids from eight tokens before it begins (its leads: the store indexes no
more of the prompt) and where it begins, ``{"ids": [...], "start": N}``; the gzip stream carries no
time stamp, so the same answers always give the same bytes (and the same cached table).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
from pathlib import Path

from specdec_cli.decoding.drafters.suffix import MAX_MATCH

OUT = Path(__file__).resolve().parent.parent / "specdec_cli" / "trained" / "smollm2-135m-answers.jsonl.gz"


def lines(pattern: str) -> list[str]:
    """The greedy answers as store lines, in shard order."""
    found = []
    for path in sorted(glob.glob(pattern)):
        with gzip.open(path, "rt", encoding="utf-8") as shard:
            for line in shard:
                record = json.loads(line)
                if record.get("kind") == "greedy":
                    ids, start = record["ids"], record.get("start", 0)
                    lead = max(start - MAX_MATCH, 0)
                    found.append(json.dumps({"ids": ids[lead:], "start": start - lead}, separators=(",", ":")))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", default="examples/answers/*/*.jsonl.gz", help="the shards to read (a glob)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    found = lines(args.answers)
    args.out.write_bytes(gzip.compress(("\n".join(found) + "\n").encode(), compresslevel=9, mtime=0))
    tokens = sum(len(json.loads(line)["ids"]) - json.loads(line)["start"] for line in found)
    print(f"{args.out}: {len(found):,} answers, {tokens:,} answer tokens, {args.out.stat().st_size / 2**20:.1f} MB")


if __name__ == "__main__":
    main()
