"""Prompts of ~1,600 tokens between short ones, with no scenario, as a user's piped file would come:
what a verify block's cost by context (docs/design.md, "The adaptive controller") is for. Each long
prompt is four of the long-context passages of benchmarks/unseen-prompts.jsonl, rotated, and one
question; each short one is one of that file's chat prompts. Writes benchmarks/long-mixed.jsonl.

    python3 benchmarks/make_long_mixed.py
"""

from __future__ import annotations

import json
from pathlib import Path

QUESTIONS = [
    "Which two of these passages are closest in subject, and why?",
    "Summarise the first passage in two sentences.",
    "List one number or date mentioned in each passage.",
    "Which passage would interest a teacher most? Explain briefly.",
    "Write a title for each passage.",
    "What does the last passage ask for?",
    "Name the people or places that appear in more than one passage.",
    "Which passage is the most formal in tone?",
]


def main() -> None:
    here = Path(__file__).parent
    rows = [json.loads(line) for line in (here / "unseen-prompts.jsonl").read_text().splitlines()]
    passages = [row["prompt"] for row in rows if row.get("scenario") == "long-context"]
    chats = [row["prompt"] for row in rows if row.get("scenario") == "chat"]
    with (here / "long-mixed.jsonl").open("w") as out:
        for i, (question, chat) in enumerate(zip(QUESTIONS, chats)):
            order = (passages[i:] + passages[:i])[:4]
            text = "\n\n".join(f"Passage {n}:\n{p}" for n, p in enumerate(order, start=1))
            out.write(json.dumps({"id": f"long-{i + 1}", "prompt": f"{text}\n\n{question}"}) + "\n")
            out.write(json.dumps({"id": f"short-{i + 1}", "prompt": chat}) + "\n")


if __name__ == "__main__":
    main()
