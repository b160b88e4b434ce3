"""A seeded set of checkable tasks (arithmetic, string, list) with known answers, made here.

Relaxed acceptance changes text; whether it changes *correctness* needs prompts with an answer that
can be checked without a judge. The kinds are ones the 135M default target solves at greedy often
enough that a loss is measurable. ``python -m specdec_cli.measure.tasks N SEED`` writes JSONL prompts
(``id``, ``scenario``, ``prompt``, ``answer``) that bench reads like any other prompt file.
"""

from __future__ import annotations

import json
import random
import re
import sys

WORDS = ["apple", "river", "garden", "pencil", "window", "tiger", "candle", "rocket", "forest", "bottle", "guitar",
         "planet", "basket", "mirror", "castle", "orange", "silver", "dragon", "pillow", "butter"]


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return f"What is {a} + {b}? Reply with the number only.", str(a + b)


CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Germany": "Berlin", "Spain": "Madrid",
            "England": "London", "Russia": "Moscow", "Egypt": "Cairo"}


def _capital(rng: random.Random) -> tuple[str, str]:
    country = rng.choice(sorted(CAPITALS))
    return f"What is the capital of {country}? Reply with the city only.", CAPITALS[country]


def _first(rng: random.Random) -> tuple[str, str]:
    items = rng.sample(WORDS, 4)
    return f"What is the first word in this list: {', '.join(items)}? Reply with the word only.", items[0]


def _last(rng: random.Random) -> tuple[str, str]:
    items = rng.sample(WORDS, 4)
    return f"What is the last word in this list: {', '.join(items)}? Reply with the word only.", items[-1]


# Tried and dropped, the 135M target failing nearly all at greedy: next in a sequence, the larger of two
# numbers, a word in capitals, counting a list, copying a phrase.
TASKS = {"add": _add, "capital": _capital, "first": _first, "last": _last}


def make_tasks(n: int, seed: int = 0, kinds: tuple[str, ...] = tuple(TASKS)) -> list[dict]:
    """N tasks, the kinds taken in turn; the same N and seed give the same tasks."""
    rng = random.Random(seed)
    tasks = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        prompt, answer = TASKS[kind](rng)
        tasks.append({"id": f"task-{kind}-{i + 1}", "scenario": f"task-{kind}", "prompt": prompt, "answer": answer})
    return tasks


def is_correct(answer: str, output: str) -> bool:
    """A number must close the first line of the output; a word must appear in it as a word (any case)."""
    if answer.isdigit():  # the last number of the first line: "7 + 5 = 12" and "The answer is 12." both count
        line = next((line for line in output.splitlines() if line.strip()), "")
        numbers = re.findall(r"-?\d+", line)
        return bool(numbers) and numbers[-1] == answer
    return re.search(rf"\b{re.escape(answer)}\b", output, re.IGNORECASE) is not None


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    for task in make_tasks(count, int(sys.argv[2]) if len(sys.argv) > 2 else 0):
        print(json.dumps(task))
