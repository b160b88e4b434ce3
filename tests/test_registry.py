"""models.yaml's `drafters:`: parsing, paths relative to the file's real directory, refusals, and
how --draft / --drafter pick among a pair's drafters."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.errors import UserError
from specdec_cli.limits import MAX_K
from specdec_cli.pairs.registry import DrafterSpec, ModelSpec, load_registry, override
from specdec_cli.pairs.sources import ModelSource


def fake_head(directory: Path) -> None:
    directory.mkdir(parents=True)
    (directory / "specdec-draft.json").write_text('{"kind": "head"}')


def linked_registry(tmp_path: Path, pair: str) -> tuple[Path, Path]:
    """A models.yaml in real/ holding one pair 'p', reached through link/models.yaml, a symlink."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "models.yaml").write_text(f"pairs:\n  p:\n{pair}")
    (tmp_path / "link").mkdir()
    link = tmp_path / "link" / "models.yaml"
    link.symlink_to(real / "models.yaml")
    return link, real.resolve()


ALTERNATES = """    target: ./target
    draft: ngram
    drafters:
      model: ./draft
      head: heads/mine
"""


def test_drafters_parse_with_paths_relative_to_the_files_real_directory(tmp_path, monkeypatch):
    link, real = linked_registry(tmp_path, ALTERNATES)
    fake_head(real / "heads" / "mine")  # a string is a head only if its directory says so: found via real/
    monkeypatch.chdir(tmp_path / "link")  # neither the working directory nor the link's may count
    pair = load_registry(link).pair("p")
    assert pair.drafter == DrafterSpec()
    assert pair.target.source == ModelSource("path", str(real / "target"))
    assert pair.alternates == {
        "ngram": DrafterSpec(),
        "model": DrafterSpec(model=ModelSpec(ModelSource("path", str(real / "draft")))),
        "head": DrafterSpec(head=real / "heads" / "mine"),
    }


def test_without_drafters_the_default_is_the_only_alternate(tmp_path):
    link, real = linked_registry(tmp_path, "    target: ./target\n    draft: {kind: head, source: h}\n")
    pair = load_registry(link).pair("p")
    assert pair.alternates == {"head": DrafterSpec(head=real / "h")}
    assert pair.alternate("ngram") == DrafterSpec() and pair.alternate("model") is None


def test_sources_resolve_relative_paths_only(tmp_path):
    base = tmp_path.resolve()
    assert ModelSource.parse("hf:OWNER/NAME#f.gguf", base) == ModelSource("hub", "OWNER/NAME", "f.gguf")
    assert ModelSource.parse("package:pkg/m.gguf", base) == ModelSource("package", "pkg/m.gguf")
    assert ModelSource.parse("OWNER/NAME", base) == ModelSource("hub", "OWNER/NAME")  # no such directory
    (base / "OWNER" / "NAME").mkdir(parents=True)
    assert ModelSource.parse("OWNER/NAME", base) == ModelSource("path", str(base / "OWNER" / "NAME"))
    assert ModelSource.parse("./m.gguf", base) == ModelSource("path", str(base / "m.gguf"))
    assert ModelSource.parse("/abs/m", base) == ModelSource("path", "/abs/m")
    assert ModelSource.parse("./m", None) == ModelSource("path", "m")  # the command line: the working directory


@pytest.mark.parametrize("drafters, message", [
    ("{fast: ngram}", "pair 'p': unknown drafter kind 'fast' under 'drafters'; use model, head, ngram, recycle, suffix, store"),
    ("{head: ngram}", "pair 'p': drafters.head names a drafter of kind ngram (ngram (prompt lookup)), not head "
                      "(a head is a directory written by `specdec train-draft --kind head`)"),
    ("{ngram: ./d}", "pair 'p': drafters.ngram names a drafter of kind model ({real}/d), not ngram"),
    ("{model: {kind: head, source: h}}", "pair 'p': drafters.model names a drafter of kind head (head {real}/h), not model"),
    ("{model: ./a}", "pair 'p': drafters.model ({real}/a) differs from 'draft' ({real}/d); a pair has one drafter of each kind"),
    ("[./d]", "pair 'p': 'drafters' must map drafter kinds (model, head, ngram, recycle, suffix, store) to drafters"),
])
def test_bad_drafters_are_one_line_and_exit_code_2(tmp_path, drafters, message):
    link, real = linked_registry(tmp_path, f"    target: ./t\n    draft: ./d\n    drafters: {drafters}\n")
    result = CliRunner().invoke(app, ["models", "--models", str(link)])
    assert result.exit_code == 2, result.output
    assert " ".join(result.stderr.split()) == f"specdec: error: {link}: " + message.format(real=real)


def test_drafter_and_draft_overrides(tmp_path):
    link, real = linked_registry(tmp_path, ALTERNATES.replace("heads/mine", "{kind: head, source: h}"))
    pair = load_registry(link).pair("p")
    assert override(pair, drafter="model").drafter == pair.alternates["model"]
    assert override(pair, drafter="head").drafter == DrafterSpec(head=real / "h")
    assert override(override(pair, drafter="model"), drafter="ngram").drafter == DrafterSpec()
    replaced = override(pair, draft="/elsewhere/draft")  # --draft: the default, and the model alternate
    assert replaced.drafter == replaced.alternates["model"] == DrafterSpec(model=ModelSpec(ModelSource("path", "/elsewhere/draft")))
    assert override(pair, draft="/elsewhere/draft", drafter="ngram").alternate("model") == replaced.drafter
    with pytest.raises(UserError, match="^unknown drafter 'fast'; choose one of model, head, ngram, recycle, suffix, store$"):
        override(pair, drafter="fast")


def test_lookup_puts_prompt_lookup_before_a_learned_drafter(tmp_path):
    link, real = linked_registry(tmp_path, "    target: hf:o/t\n    draft: {kind: head, source: h, lookup: true}\n"
                                           "    drafters: {model: {source: ./d, lookup: false}}\n")
    fake_head(real / "h")
    pair = load_registry(link).pair("p")
    assert pair.drafter == DrafterSpec(head=real / "h", lookup=True)
    assert str(pair.drafter) == f"head {real / 'h'}, after prompt lookup"
    assert pair.alternate("model").lookup is False and pair.alternate("model").model.source.location == str(real / "d")
    fake_head(tmp_path / "mine")  # --draft with a head of one's own keeps the pair's lookup for heads
    assert override(pair, draft=str(tmp_path / "mine")).drafter == DrafterSpec(head=tmp_path / "mine", lookup=True)
    assert override(pair, draft="/elsewhere/draft").drafter.lookup is False  # as the pair's model drafter
    assert override(pair, draft="ngram").drafter == DrafterSpec()


def test_lookup_must_be_a_boolean(tmp_path):
    link, real = linked_registry(tmp_path, "    target: hf:o/t\n    draft: {kind: head, source: h, lookup: 'yes'}\n")
    fake_head(real / "h")
    with pytest.raises(UserError, match="'lookup' is true or false, got 'yes'"):
        load_registry(link)


@pytest.mark.parametrize("pair, message", [
    ("    target: ./t\n    draft: ngram\n    kk: 3\n", "pair 'p': unknown key 'kk'; the keys are description, target, draft, "
                                                   "drafters, dtype, k, scenarios, adaptive, pad_blocks, profile"),
    ("    target: ./t\n    draft: ngram\n    k: true\n", "pair 'p': K must be an integer from 0 to {MAX_K}, got True"),
    ("    target: ./t\n    draft: ngram\n    scenarios: {chat: false}\n",
     "pair 'p' scenario 'chat': K must be an integer from 0 to {MAX_K}, got False"),
    ("    target: ./t\n    draft: ngram\n    pad_blocks: 'no'\n", "pair 'p': 'pad_blocks' is true or false, got 'no'"),
])
def test_a_misspelt_key_or_a_boolean_k_is_one_line_and_exit_code_2(tmp_path, pair, message):
    """Either was once taken without a word: the setting lost, or `"k": true` in the JSON."""
    link, _ = linked_registry(tmp_path, pair)
    result = CliRunner().invoke(app, ["models", "--models", str(link)])
    assert result.exit_code == 2, result.output
    assert " ".join(result.stderr.split()) == f"specdec: error: {link}: " + message.format(MAX_K=MAX_K)


def test_an_unknown_top_level_key_is_refused(tmp_path):
    (tmp_path / "models.yaml").write_text("defualt: p\npairs:\n  p:\n    target: ./t\n    draft: ngram\n")
    with pytest.raises(UserError, match="models.yaml: unknown key 'defualt'; the keys are default, pairs$"):
        load_registry(tmp_path / "models.yaml")


def test_free_lists_the_free_drafters_auto_weighs_beside_the_pairs_own(tmp_path):
    link, real = linked_registry(tmp_path, "    target: hf:o/t\n    draft: {kind: head, source: h, lookup: true, free: [recycle, suffix]}\n")
    fake_head(real / "h")
    pair = load_registry(link).pair("p")
    assert pair.drafter == DrafterSpec(head=real / "h", lookup=True, beside=("recycle", "suffix"))
    assert str(pair.drafter).endswith("after prompt lookup; recycle, suffix beside it under -k auto")
    fake_head(tmp_path / "mine")  # --draft with a head of one's own keeps what stands beside the pair's
    assert override(pair, draft=str(tmp_path / "mine")).drafter.beside == ("recycle", "suffix")
    assert override(pair, drafter="suffix").drafter == DrafterSpec(free_kind="suffix")  # always there, alone
    assert override(pair, draft="recycle").drafter.kind == "recycle"


@pytest.mark.parametrize("free, message", [
    ("[ngram]", "'free' lists 'ngram'; it may list recycle, suffix, store, each once"),
    ("[recycle, recycle]", "'free' lists 'recycle'; it may list recycle, suffix, store, each once"),
    ("recycle", "'free' must list drafter kinds, as in free: [recycle, suffix, store]"),
])
def test_a_bad_free_list_is_one_line(tmp_path, free, message):
    link, real = linked_registry(tmp_path, f"    target: hf:o/t\n    draft: {{kind: ngram, free: {free}}}\n")
    with pytest.raises(UserError) as raised:
        load_registry(link)
    assert str(raised.value) == f"{link}: pair 'p' draft: {message}"


def test_a_free_drafter_may_not_stand_beside_itself(tmp_path):
    link, _ = linked_registry(tmp_path, "    target: hf:o/t\n    draft: {kind: suffix, free: [recycle, suffix]}\n")
    with pytest.raises(UserError, match="'free' lists 'suffix'; it may list recycle, store, each once$"):
        load_registry(link)


def test_a_store_is_its_file_under_drafters_beside_the_pairs_drafter_or_picked_alone(tmp_path):
    link, real = linked_registry(tmp_path, "    target: hf:o/t\n    draft: {kind: head, source: h, lookup: true, free: [store]}\n"
                                           "    drafters: {store: answers.jsonl.gz}\n")
    fake_head(real / "h")
    pair = load_registry(link).pair("p")
    store = DrafterSpec(free_kind="store", answers=real / "answers.jsonl.gz")
    assert pair.alternate("store") == store and pair.drafter.beside == ("store",)
    assert str(pair.drafter).endswith("after prompt lookup; store beside it under -k auto")
    assert override(pair, drafter="store").drafter == store


@pytest.mark.parametrize("pair, message", [
    ("    draft: {kind: ngram, free: [store]}\n", "pair 'p': 'free' lists 'store', but the pair has no store; "
     "name a file of the target's answers under `drafters: {store: FILE}`"),
    ("    draft: store\n", "pair 'p' draft: a store drafts from a file: name it as {kind: store, source: FILE}, "
     "or under `drafters: {store: FILE}` and pick it with --drafter store"),
    ("    draft: {kind: store}\n", "pair 'p' draft: a store needs 'source', the file of the target's answers it drafts from"),
])
def test_a_store_without_its_file_is_one_line(tmp_path, pair, message):
    link, _ = linked_registry(tmp_path, "    target: hf:o/t\n" + pair)
    with pytest.raises(UserError) as raised:
        load_registry(link)
    assert str(raised.value) == f"{link}: {message}"


def test_picking_a_store_the_pair_has_not_is_one_line(tmp_path):
    link, _ = linked_registry(tmp_path, "    target: hf:o/t\n    draft: ngram\n")
    with pytest.raises(UserError) as raised:
        override(load_registry(link).pair("p"), drafter="store")
    assert str(raised.value) == "pair 'p' has no store; name a file of the target's answers under `drafters: {store: FILE}`"
