"""The suffix memory kept between runs (suffix_file.py, `generate --memory FILE`): what it keeps, its
bound, every bad file (missing, truncated, corrupt, another target's) and two writers sharing one."""

import json

import torch
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.decoding.suffix import SuffixDrafter
from specdec_cli.decoding.suffix_file import MemoryFile, bounded, read

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
    assert bounded([([1] * 20, 1)], 9) == [([1] * 20, 1)]  # the newest always
    path = tmp_path / "memory.json"
    memory_with(path, [9, 1, 2, 3], [9, 4, 5, 6], limit=8)[0].save()
    memory_with(path, [9, 7, 8, 9], limit=8)[0].save()
    assert [tokens for tokens, _ in read(path, ME, 50)[0]] == [[9, 4, 5, 6], [9, 7, 8, 9]]


def test_a_truncated_or_corrupt_file_is_one_warning_an_empty_memory_and_replaced(tmp_path):
    path = tmp_path / "memory.json"
    memory_with(path, [9, 1, 2, 3])[0].save()
    whole = path.read_text()
    bad = {"truncated": whole[: len(whole) // 2], "not JSON": "\x00\xff garbage",
           "an id past the vocabulary": json.dumps({"format": 1, "target": ME, "answers": [[1, [9, 99]]]}),
           "a lead past the answer": json.dumps({"format": 1, "target": ME, "answers": [[2, [9, 1]]]}),
           "another format": json.dumps({"format": 2, "target": ME, "answers": []})}
    for name, text in bad.items():
        path.write_text(text)
        kept, warning = memory_with(path, [9, 5, 6])
        assert warning.startswith(f"--memory {path}: ") and warning.endswith(
            "starting with an empty memory (the file is replaced at the end)"), name
        assert list(kept.memory.answers) == [([9, 5, 6], 1)], name
        kept.save()
        assert read(path, ME, 50) == ([([9, 5, 6], 1)], None), name


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
    path.write_text('{"format": 1, "target": ')
    third, stderr = run("--drafter", "suffix", "-k", "4", "--memory", str(path))
    assert [r["token_ids"] for r in third] == [r["token_ids"] for r in plain]
    assert stderr.count("\n") == 1 and "starting with an empty memory" in stderr


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
