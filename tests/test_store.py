"""The static store (decoding/drafters/store.py, store_file.py): its table drafts what the suffix memory's
dictionaries draft, a run with it equals plain decoding token for token and samples the target's
distribution exactly, and its answers file is checked (one line per mistake) and indexed once."""

import gzip
import json
import logging

import numpy as np
import pytest
import torch
from conftest import PROMPT, decode
from exactness import assert_lossless, small_models

from specdec_cli.decoding.acceptance import SamplingParams
from specdec_cli.decoding.drafters.store import StoreDrafter
from specdec_cli.decoding.drafters.store_file import MASK, PRIME, build_table, opened_table, suffix_hashes, window_hashes
from specdec_cli.decoding.drafters.suffix import MAX_MATCH, MIN_MATCH
from specdec_cli.decoding.drafters.suffix import continuation, count
from specdec_cli.errors import UserError

# No n-gram has two successors seen equally often, so the table and the dictionaries must agree.
ANSWERS = [([1, 2, 3, 4, 5, 6, 7], 0), ([1, 2, 3, 4, 5, 6, 7], 0), ([9, 2, 3, 4, 8, 8], 1), ([7, 7, 2, 3, 6], 0)]


def test_the_table_drafts_what_the_memorys_dictionaries_draft():
    table, counts = build_table(ANSWERS), {}
    for tokens, lead in ANSWERS:
        count(counts, tokens, lead, 1)
    tails = [[1, 2], [2, 3], [1, 2, 3], [9, 2, 3, 4], [3, 4], [7, 7], [5, 5], [0], [], [2, 3, 4, 5, 6]]
    for tail in tails:
        for k in (1, 3, 6):
            assert table.continuation(tail, k) == continuation(counts, tail, k), (tail, k)
    assert table.continuation([1, 2, 3], 6) == ([4, 5, 6], 3)  # no further than the match is long


def test_a_tails_hashes_are_the_tables_hashes_of_its_n_grams():
    """A lookup finds what building indexed: each n-gram ending the tail hashed as window_hashes hashes
    it (and as the hash's definition reads, token by token), for tails shorter and longer than MAX_MATCH."""
    rng = np.random.default_rng(0)
    for length in (0, 1, MIN_MATCH, MAX_MATCH - 1, MAX_MATCH, MAX_MATCH + 5):
        tail = rng.integers(0, 50_000, length).tolist()
        lengths = range(min(MAX_MATCH, length), MIN_MATCH - 1, -1)
        built = [int(window_hashes(np.asarray(tail, np.int64), n, np.array([length]))[0]) for n in lengths]
        defined = []
        for n in lengths:
            h = n
            for token in tail[-n:]:
                h = (h * PRIME + token + 1) & MASK
            defined.append(h)
        assert suffix_hashes(tail) == built == defined, length


def test_a_tie_drafts_the_smallest_id_and_a_share_below_a_tenth_stops_the_draft():
    table = build_table([([5, 6, 9], 0), ([5, 6, 4], 0)])
    assert table.continuation([5, 6], 2) == ([4], 2)
    crowded = build_table([([5, 6, t, 1, 1], 0) for t in range(11, 23)])  # twelve successors, a twelfth each
    assert crowded.continuation([5, 6], 2) == ([], 2)


def test_a_draft_is_tagged_by_its_matchs_length():
    drafter = StoreDrafter(build_table([([1, 2, 3, 4, 5, 6, 7, 8], 0)]))
    sources = [drafter.propose(torch.tensor(tail), 4, None, None).source for tail in ([0, 1, 2], [0, 1, 2, 3], [1, 2, 3, 4])]
    assert sources == ["store-2", "store-3", "store"]
    assert drafter.propose(torch.tensor([0, 0, 0]), 4, None, None).source == ""


def test_an_empty_table_drafts_nothing():
    assert build_table([([3], 0)]).continuation([1, 3], 4) == ([], 0)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_the_store_equals_plain_decoding_token_for_token(target, plain, k):
    drafter = StoreDrafter(build_table([(PROMPT + plain[:20], len(PROMPT))]))  # the first half of the answer, stored
    tokens, events = decode(target, drafter, k)
    assert tokens == plain
    assert sum(e.accepted for e in events) > 0  # it drafted, and the target kept some of it


def test_the_store_samples_exactly_the_targets_distribution():
    target, _ = small_models()
    drafter = StoreDrafter(build_table([([3, 4, 5, first, first, 5], 3) for first in range(8)]))
    assert_lossless(target, drafter, SamplingParams(1.0), k=2)


def answers_file(path, lines: list[str], compress: bool = True):
    text = "\n".join(lines) + "\n"
    path.write_bytes(gzip.compress(text.encode(), mtime=0) if compress else text.encode())
    return path


GOOD = [json.dumps({"ids": [1, 2, 3, 4, 5, 6], "start": 2}), json.dumps({"ids": [2, 3, 4, 7]})]


def test_the_table_is_built_once_kept_in_the_cache_and_the_same_every_time(tmp_path, cache, caplog):
    path = answers_file(tmp_path / "answers.jsonl.gz", GOOD)
    with caplog.at_level(logging.INFO, logger="specdec"):
        first = opened_table(path, 10)
    assert [r.getMessage() for r in caplog.records] == [f"indexing the store's 8 answer tokens (once: kept in {cache / 'stores'})"]
    [entry] = (cache / "stores").iterdir()
    kept = {p.name: p.read_bytes() for p in entry.iterdir()}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="specdec"):
        again = opened_table(path, 10)
    assert caplog.records == [] and isinstance(again.keys, np.memmap)
    assert again.continuation([2, 3], 2) == first.continuation([2, 3], 2) == ([4, 5], 2)
    (entry / "keys.npy").write_bytes(kept["keys.npy"][:20])  # cut short: built again, byte for byte the same
    opened_table(path, 10)
    assert {p.name: p.read_bytes() for p in entry.iterdir()} == kept
    with pytest.raises(UserError, match="token id 6 is outside the target's vocabulary"):
        opened_table(path, 6)  # the kept table was checked against another vocabulary: checked again


@pytest.mark.parametrize("lines, compress, message", [
    (None, True, "store {path}: not found; name a file of the target's answers (JSON lines of ids and start)"),
    (["not json"], True, "store {path}, line 1: not JSON (Expecting value: line 1 column 1 (char 0))"),
    ([GOOD[0], '{"ids": [1, "a"]}'], True, "store {path}, line 2: expected an object whose 'ids' lists token ids"),
    (['{"ids": [1, 2], "start": 2}'], True, "store {path}, line 1: 'start' must be a position in 'ids' (0 to 1), got 2"),
    (['{"ids": [1, 12]}'], True, "store {path}, line 1: token id 12 is outside the target's vocabulary (0 to 9): "
                                 "another tokenizer's answers?"),
    ([""], True, "store {path}: holds no answers"),
    (GOOD, False, "store {path}: damaged (BadGzipFile: Not a gzipped file (b'{\"')); write it again"),
])
def test_a_bad_answers_file_is_one_line(tmp_path, cache, lines, compress, message):
    path = tmp_path / "answers.jsonl.gz"
    if lines is not None:
        answers_file(path, lines, compress)
    with pytest.raises(UserError) as error:
        opened_table(path, 10)
    assert str(error.value) == message.replace("{path}", str(path))


def test_a_profile_knows_a_store_by_its_answers_not_its_path(tmp_path):
    """A profile calibrated with one store seeds the same answers anywhere, and no other answers."""
    from specdec_cli.pairs.profile import describe_drafter, drafter_identity, same_drafter
    from specdec_cli.pairs.registry import DrafterSpec, PairSpec, parse_model

    def identity(path, kind="store"):
        spec = DrafterSpec(free_kind=kind, answers=path if kind == "store" else None)
        return drafter_identity(PairSpec("p", parse_model("hf:o/t"), spec))

    here, there, other = (answers_file(tmp_path / name, lines) for name, lines in
                          (("a.jsonl.gz", GOOD), ("b.jsonl.gz", GOOD), ("c.jsonl.gz", GOOD[:1])))
    assert same_drafter(identity(here), identity(there)) and not same_drafter(identity(here), identity(other))
    assert describe_drafter(identity(here)) == f"store {here} (sha256 {identity(here)['sha256']})"
    assert identity(None, "recycle")["source"] == "recycle"  # not "ngram 1-3", as a free kind's once was


def test_a_pairs_store_drafts_from_the_command_line_and_a_mode_without_one_is_one_line(pair_dir, tmp_path, cache):
    """models.yaml names the store under `drafters:`: `--drafter store` and `-k auto` (the store beside
    lookup) give plain decoding's tokens and draft from it; a bench mode of a store the pair has not
    is refused in the mode's words."""
    from typer.testing import CliRunner

    from conftest import one_line_error
    from specdec_cli.cli import app

    def generate(*args):
        result = CliRunner().invoke(app, ["generate", "--models", str(models), "--raw", "--json", "--max-new-tokens", "24",
                                          *args, "the cat sat on"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    models = tmp_path / "models.yaml"
    models.write_text(f"default: p\npairs:\n  p:\n    target: {pair_dir / 'target'}\n    draft: {{kind: ngram, free: [store]}}\n"
                      "    drafters: {store: answers.jsonl.gz}\n    k: 3\n")
    plain = generate("-k", "0")
    answers_file(tmp_path / "answers.jsonl.gz", [json.dumps({"ids": plain["token_ids"]})])  # the answer, stored
    for mode in (["--drafter", "store", "-k", "3"], ["-k", "auto"]):
        run = generate(*mode)
        assert run["token_ids"] == plain["token_ids"] and run["stats"]["accepted"] > 0
    assert any(source.startswith("store") for source in run["stats"]["drafted_by"]), run["stats"]  # auto's

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "the cat"}\n')
    result = CliRunner().invoke(app, ["bench", "--models", str(pair_dir / "models.yaml"), "--pair", "tiny-ngram", "--prompts",
                                      str(prompts), "--modes", "plain,store:3", "--max-new-tokens", "4"])
    assert one_line_error(result) == ("mode store:3 needs a store, and pair 'tiny-ngram' has none "
                                      "(list one under `drafters:` in models.yaml)")
