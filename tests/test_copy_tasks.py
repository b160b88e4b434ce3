"""The synthetic copy tasks of examples/make_answers.py: the reply is the passage, and swapped words
come from the target's other answers."""

import sys
from pathlib import Path

from conftest import char_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from make_answers import COPY_ASKS, copy_rows  # noqa: E402


def answers(tokenizer, texts):
    rows = []
    for i, text in enumerate(texts):
        prompt = tokenizer("question", add_special_tokens=False)["input_ids"]
        rows.append({"id": f"a{i}", "kind": "greedy", "ids": prompt + tokenizer(text, add_special_tokens=False)["input_ids"],
                     "start": len(prompt)})
    rows.append({"id": "s", "kind": "sampled", "ids": tokenizer("qq zebra", add_special_tokens=False)["input_ids"], "start": 2})
    return rows


def test_the_reply_is_the_passage_and_swapped_words_come_from_greedy_answers():
    tokenizer = char_tokenizer()
    texts = ["the cat sat on the mat and then it slept", "dogs bark at night", "birds sing loudly every morning"]
    rows = copy_rows(tokenizer, answers(tokenizer, texts), 30, seed=1)
    pool = {w for t in texts for w in t.split() if w.isalpha() and len(w) > 2}
    assert len(rows) == 30 and len({r["id"] for r in rows}) == 30
    salads = 0
    for row in rows:
        reply = row["ids"][row["start"] :]
        assert reply[-1] == tokenizer.eos_token_id
        passage = tokenizer.decode(reply[:-1])
        assert passage in row["text"] and any(ask in row["text"] for ask in COPY_ASKS)
        assert row["ids"][: row["start"]] == tokenizer(row["text"])["input_ids"]  # no chat template: raw
        assert set(passage.split()) <= pool | {w for t in texts for w in t.split()}
        assert "zebra" not in passage  # a sampled answer is no source
        salads += not any(passage in t for t in texts)
    assert salads > 10  # most passages had words swapped
    assert copy_rows(tokenizer, answers(tokenizer, texts), 30, seed=1) == rows
    assert copy_rows(tokenizer, answers(tokenizer, texts), 30, seed=2) != rows


def test_a_copy_token_closes_a_bigram_seen_before_it():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from drafter_report import closes_earlier_bigram

    assert closes_earlier_bigram([5, 6, 7, 5, 6, 6, 6, 6]) == [False, False, False, False, True, False, True, True]
    assert closes_earlier_bigram([]) == [] and closes_earlier_bigram([1]) == [False]
