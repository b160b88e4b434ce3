"""The suffix memory kept between runs (suffix_file.py, `generate --memory FILE`): what it keeps, its
bound, every bad file (missing, empty, damaged, another target's, not a memory file at all, too large)
and two writers sharing one."""

import json
import os
import stat

import pytest
import torch
from typer.testing import CliRunner

from conftest import one_line_error

from specdec_cli.cli import app
from specdec_cli.decoding.drafters.suffix import SuffixDrafter
from specdec_cli.decoding.drafters.suffix_file import MemoryFile, bounded, max_bytes, read, recognise
from specdec_cli.errors import UserError

ME = {"source": "tiny", "fingerprint": "0123456789abcdef"}
OTHER = {"source": "tiny", "fingerprint": "fedcba9876543210"}


def memory_with(path, *answers, identity=ME, limit=1000):
    kept = MemoryFile(path, identity, SuffixDrafter(memory_tokens=limit, vocab_limit=50))
    warning = kept.load()
    for tokens in answers:
        kept.memory.remember(tokens, 1)
    return kept, warning


def test_a_run_adds_its_answers_and_the_next_run_drafts_from_them(tmp_path):
    path = tmp_path / "memory.json"
    first, warning = memory_with(path, [9, 1, 2, 3, 4])
    assert warning is None and not path.exists()  # a first run: nothing to read, nothing said
    first.save()
    second, warning = memory_with(path)
    assert warning is None and list(second.memory.answers) == [([9, 1, 2, 3, 4], 1)]
    assert second.memory.propose(torch.tensor([7, 1, 2]), 2, None, None).tokens.tolist() == [3, 4]
    second.save()  # nothing new: the file is not rewritten
    assert read(path, ME, 50)[0] == [([9, 1, 2, 3, 4], 1)]


def test_two_runs_sharing_one_file_keep_both_their_answers(tmp_path):
    path = tmp_path / "memory.json"
    memory_with(path, [9, 1, 2])[0].save()
    a, _ = memory_with(path, [9, 3, 4])
    b, _ = memory_with(path, [9, 5, 6])  # read before a wrote
    a.save()
    b.save()
    assert [tokens for tokens, _ in read(path, ME, 50)[0]] == [[9, 1, 2], [9, 3, 4], [9, 5, 6]]


def test_the_file_keeps_the_newest_answers_within_the_bound(tmp_path):
    assert bounded([([1] * 4, 1), ([2] * 4, 1), ([3] * 4, 1)], 9) == [([2] * 4, 1), ([3] * 4, 1)]
    assert bounded([([1] * 20, 1)], 9) == [([1] * 9, 1)]  # the newest always, cut to the bound: files stay in max_bytes
    path = tmp_path / "memory.json"
    memory_with(path, [9, 1, 2, 3], [9, 4, 5, 6], limit=8)[0].save()
    memory_with(path, [9, 7, 8, 9], limit=8)[0].save()
    assert [tokens for tokens, _ in read(path, ME, 50)[0]] == [[9, 4, 5, 6], [9, 7, 8, 9]]


def test_a_damaged_memory_file_is_one_warning_an_empty_memory_and_replaced(tmp_path):
    """A file that parses as a memory file (specdec wrote it) but whose answers do not hold."""
    path = tmp_path / "memory.json"
    bad = {"an id past the vocabulary": json.dumps({"format": 1, "target": ME, "answers": [[1, [9, 99]]]}),
           "a lead past the answer": json.dumps({"format": 1, "target": ME, "answers": [[2, [9, 1]]]}),
           "answers not a list": json.dumps({"format": 1, "target": ME, "answers": 7})}
    for name, text in bad.items():
        path.write_text(text)
        assert recognise(path), name
        kept, warning = memory_with(path, [9, 5, 6])
        assert warning.startswith(f"--memory {path}: ") and warning.endswith(
            "starting with an empty memory (the file is replaced at the end)"), name
        assert list(kept.memory.answers) == [([9, 5, 6], 1)], name
        kept.save()
        assert read(path, ME, 50) == ([([9, 5, 6], 1)], None, False), name


def not_memory_files(tmp_path) -> dict:
    """Files that --memory must not replace: what specdec never writes there."""
    path = tmp_path / "whole.json"
    memory_with(path, [9, 1, 2, 3])[0].save()
    whole = path.read_text()
    return {"truncated": whole[: len(whole) // 2], "not JSON": "\x00\xff garbage", "notes": "buy milk\n",
            "a JSON config": json.dumps({"model": "x", "k": 3}), "prompts": "hello\n{\"prompt\": \"x\"}\n",
            "another format": json.dumps({"format": 2, "target": ME, "answers": []}),
            "200k-deep nesting": '{"format": 1, "target": ' + "[" * 200_000}


def test_a_file_that_is_not_a_memory_file_is_not_recognised_and_never_replaced(tmp_path):
    """It was taken for a corrupt memory file and replaced (200k-deep nesting: a RecursionError)."""
    path = tmp_path / "memory.json"
    for name, text in not_memory_files(tmp_path).items():
        path.write_text(text)
        assert not recognise(path), name
        kept, warning = memory_with(path, [9, 5, 6])  # had the check been passed by: a file changed since
        assert warning.endswith("starting with an empty memory (the file is left as it is)"), name
        kept.save()
        assert path.read_text() == text, name
    for text in ("", "\n"):  # empty: a first run, replaced
        path.write_text(text)
        assert recognise(path)
        kept, warning = memory_with(path, [9, 5, 6])
        assert warning is None
        kept.save()
        assert read(path, ME, 50) == ([([9, 5, 6], 1)], None, False)


def test_a_file_that_stops_being_a_memory_file_during_the_run_is_left_alone_and_the_write_fails(tmp_path):
    path = tmp_path / "memory.json"
    kept, _ = memory_with(path, [9, 5, 6])
    path.write_text("notes written meanwhile\n")
    with pytest.raises(OSError, match="is not a specdec memory file of format 1 now, so it is left alone"):
        kept.save()
    assert path.read_text() == "notes written meanwhile\n"


def test_a_file_past_its_bound_in_bytes_is_refused_unread(tmp_path):
    """A 50 MB file took 43 s and ~1 GB to load, then was cut to 120 kB without a word."""
    path = tmp_path / "memory.json"
    answer = "[1,[" + ",".join(["9"] * 100) + "]]"
    path.write_text('{"format":1,"target":' + json.dumps(ME) + ',"answers":['
                    + ",".join([answer] * (max_bytes() // len(answer) + 1)) + "]}")
    assert os.path.getsize(path) > max_bytes() > 16 * 20_000
    with pytest.raises(UserError, match=r"bytes, more than a memory file holds \(385,536\): not a file specdec wrote"):
        recognise(path)
    kept, warning = memory_with(path, [9, 5, 6])
    assert "more than a memory file holds" in warning and warning.endswith("(the file is left as it is)")


def test_a_file_holding_more_tokens_than_the_memory_keeps_is_cut_with_one_warning(tmp_path):
    """Within its bytes, a file of short ids can hold more tokens than the memory keeps: the newest are
    used, and it says so (the memory indexed them all, then forgot the oldest, silently)."""
    path = tmp_path / "memory.json"
    path.write_text(json.dumps({"format": 1, "target": ME, "answers": [[1, [9, 1, 2, 3]], [1, [9, 4, 5, 6]], [1, [9, 7, 8, 9]]]}))
    kept, warning = memory_with(path, limit=8)
    assert warning == (f"--memory {path}: holds 12 tokens, more than the memory keeps (8); using its newest answers "
                       "(the rest go when it is next written)")
    assert list(kept.memory.answers) == [([9, 4, 5, 6], 1), ([9, 7, 8, 9], 1)]
    assert kept.memory.size == 8  # never indexed past the bound


def test_the_memory_file_is_private(tmp_path):
    """It holds the user's answers: it was 0644 (the head is 0600)."""
    path = tmp_path / "memory.json"
    memory_with(path, [9, 1, 2])[0].save()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    os.chmod(path, 0o644)  # written by an older specdec
    memory_with(path, [9, 3, 4])[0].save()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_another_targets_file_is_one_warning_and_left_as_it_is(tmp_path):
    path = tmp_path / "memory.json"
    memory_with(path, [9, 1, 2], identity=OTHER)[0].save()
    before = path.read_text()
    kept, warning = memory_with(path, [9, 5, 6])
    assert "another target's memory" in warning and warning.endswith("(the file is left as it is)")
    assert list(kept.memory.answers) == [([9, 5, 6], 1)]
    kept.save()
    assert path.read_text() == before


def test_generate_keeps_the_memory_between_runs_and_a_bad_file_changes_nothing(pair_dir, tmp_path):
    path = tmp_path / "memory.json"
    prompts = "abcabcabd\nxyzxyzxyw\n"

    def run(*options):
        result = CliRunner().invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--pair", "tiny-alt",
                                          "--max-new-tokens", "12", "--json", *options], input=prompts)
        assert result.exit_code == 0, result.output
        return [json.loads(line) for line in result.stdout.splitlines()], result.stderr

    plain, _ = run("-k", "0")
    first, stderr = run("--drafter", "suffix", "-k", "4", "--memory", str(path))
    assert stderr == ""
    stored = json.loads(path.read_text())
    assert len(stored["answers"]) == 2 and stored["target"]["fingerprint"]
    second, _ = run("--drafter", "suffix", "-k", "4", "--memory", str(path))
    assert [r["token_ids"] for r in first] == [r["token_ids"] for r in second] == [r["token_ids"] for r in plain]
    assert second[0]["stats"]["accepted"] > first[0]["stats"]["accepted"]  # the first prompt drafts from the file
    assert len(json.loads(path.read_text())["answers"]) == 4
    stored["answers"][0][1][-1] = 10**6  # an id past the vocabulary: ours, damaged
    path.write_text(json.dumps(stored))
    third, stderr = run("--drafter", "suffix", "-k", "4", "--memory", str(path))
    assert [r["token_ids"] for r in third] == [r["token_ids"] for r in plain]
    assert stderr.count("\n") == 1 and "its answers are damaged; starting with an empty memory" in stderr
    assert len(json.loads(path.read_text())["answers"]) == 2  # replaced: this run's answers


def test_generate_refuses_a_file_that_is_not_a_memory_file_before_any_model_loads(pair_dir, tmp_path, monkeypatch):
    """Any such file was taken for a corrupt memory file and replaced at the end, exit 0: a notes file,
    a config, even the prompts being read (`--memory p2.txt - < p2.txt`)."""
    from specdec_cli.decoding import loaded_pair

    monkeypatch.setattr(loaded_pair, "load_pair", lambda *a, **k: pytest.fail("the pair was loaded"))
    path = tmp_path / "memory.json"
    for name, text in not_memory_files(tmp_path).items():
        path.write_text(text)
        result = CliRunner().invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--pair", "tiny-alt",
                                          "--drafter", "suffix", "-k", "3", "--memory", str(path), "-"], input=text)
        assert one_line_error(result) == (f"--memory {path}: not a file specdec wrote, so it is left alone; "
                                          "give another name or delete it"), name
        assert path.read_text() == text, name
    path.write_bytes(b"x" * (max_bytes() + 1))
    result = CliRunner().invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--pair", "tiny-alt",
                                      "--drafter", "suffix", "-k", "3", "--memory", str(path), "hi"])
    assert one_line_error(result).endswith("bytes, more than a memory file holds (385,536): not a file specdec wrote, "
                                           "so it is left alone; give another name or delete it")
    assert os.path.getsize(path) == max_bytes() + 1


def test_generate_takes_an_empty_file_as_a_first_run(pair_dir, tmp_path):
    """It said the file 'cannot be read (JSONDecodeError...)'."""
    path = tmp_path / "memory.json"
    path.write_text("")
    result = CliRunner().invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--pair", "tiny-alt",
                                      "--drafter", "suffix", "-k", "3", "--max-new-tokens", "4", "--json",
                                      "--memory", str(path), "hi"])
    assert result.exit_code == 0 and result.stderr == "", result.output
    assert len(json.loads(path.read_text())["answers"]) == 1


def test_memory_is_refused_where_the_run_does_not_draft_with_it(pair_dir, tmp_path):
    def run(*options):
        return CliRunner().invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--pair", "tiny-alt",
                                        "--memory", str(tmp_path / "m.json"), *options, "hi"])

    for options in (["-k", "3"], ["--drafter", "suffix", "-k", "0"]):
        result = run(*options)
        assert result.exit_code == 2 and "--memory keeps the suffix memory" in result.output, options
    directory = run("--drafter", "suffix", "-k", "3", "--memory", str(tmp_path))
    assert directory.exit_code == 2 and "is a directory" in directory.output
    assert not (tmp_path / "m.json").exists()
