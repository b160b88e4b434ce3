"""Hand-written training prompts stay apart from the prompt files heads are judged on."""

import json
import sys
from pathlib import Path

import pytest

from specdec_cli.prompts import read_file
from specdec_cli.training.corpus import phrases, sharing_phrases

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from make_answers import HANDWRITTEN, JUDGED_ON, handwritten_prompts  # noqa: E402


def test_a_shared_six_word_run_is_caught_and_five_words_are_not():
    judged = ["Could you explain, in simple words, how a heat pump warms a house?"]
    assert sharing_phrases(["so: HOW a heat pump warms a HOUSE in winter"], judged) == [
        "so: HOW a heat pump warms a HOUSE in winter"]  # case and punctuation aside
    assert sharing_phrases(["how a heat pump warms the water"], judged) == []  # five words in common
    assert phrases("one two three", n=2) == {("one", "two"), ("two", "three")}
    assert phrases("too short", n=6) == set()


def test_the_committed_hand_written_prompts_share_no_wording_with_judged_files():
    prompts = handwritten_prompts()  # refuses the file otherwise
    assert len(prompts) >= 400 and len({p.id for p in prompts}) == len(prompts)
    assert all(p.id.startswith("hand-") for p in prompts)
    judged = {p.text for path in JUDGED_ON for p in read_file(path)}
    assert not judged & {p.text for p in prompts}


def test_a_hand_written_prompt_copied_from_a_judged_file_is_refused(tmp_path, monkeypatch):
    import make_answers

    unseen = next(path for path in JUDGED_ON if path.name == "unseen-prompts.jsonl")
    borrowed = read_file(unseen)[5].text
    path = tmp_path / "prompts.jsonl"
    path.write_text(HANDWRITTEN.read_text() + '{"id": "hand-x", "prompt": %s}\n' % json.dumps(borrowed))
    monkeypatch.setattr(make_answers, "HANDWRITTEN", path)
    with pytest.raises(SystemExit, match="1 of the hand-written prompts share wording"):
        make_answers.handwritten_prompts()
