"""A new free drafter kind is one module and one line in pairs/free_kinds.py's FREE_KINDS: here the module is
written by the test, put on the path, and its line added to FREE_KINDS for the test alone. With no other file
changed it is listed (the help texts, `specdec models`), benched, priced free by the adaptive controller,
refused where a free drafter must be (a tree), and run token for token as plain decoding runs."""

import importlib
import json
import sys

import pytest
from typer.testing import CliRunner

from conftest import one_line_error
from specdec_cli.cli import app
from specdec_cli.pairs import free_kinds

KIND = "echo"
MODULE = "echo_drafter"
WHAT = "what followed the last token where it last occurred"
SOURCE = '''"""A drafter of a kind specdec does not ship: what followed the last token where it last occurred."""

import torch

from specdec_cli.decoding.drafters.base import Draft, Drafter


class EchoDrafter(Drafter):
    name = "echo"
    free = True

    @classmethod
    def for_pair(cls, spec, vocab_size):
        return cls()

    def propose(self, context, k, sampling, noise, gate=None):
        tokens, found = context.tolist(), []
        while len(found) < k:
            earlier = [i for i in range(len(tokens) - 1) if tokens[i] == tokens[-1]]
            if not earlier:
                break
            tokens.append(tokens[earlier[-1] + 1])
            found.append(tokens[-1])
        return Draft(torch.tensor(found, dtype=torch.long), source=self.name if found else "")
'''
runner = CliRunner()


@pytest.fixture
def echo(tmp_path, monkeypatch):
    """The kind's module on the path and its line in FREE_KINDS, for this test only."""
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    monkeypatch.setitem(free_kinds.FREE_KINDS, KIND, free_kinds.FreeKind(KIND, WHAT, f"{MODULE}:EchoDrafter"))
    yield
    sys.modules.pop(MODULE, None)


@pytest.fixture
def echo_models(pair_dir, tmp_path) -> str:
    """A models.yaml with a pair drafted by the new kind, and one that puts it beside prompt lookup."""
    path = tmp_path / "models.yaml"
    path.write_text(f"default: echo\npairs:\n  echo:\n    target: {pair_dir / 'target'}\n    draft: {KIND}\n    k: 3\n"
                    f"  beside:\n    target: {pair_dir / 'target'}\n    draft: {{kind: ngram, free: [{KIND}]}}\n")
    return str(path)


def generate(models: str, *options: str) -> dict:
    result = runner.invoke(app, ["generate", "--models", models, "--json", "--max-new-tokens", "16", *options,
                                 "abcabcabc abcabc"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_new_kind_is_listed_wherever_the_free_kinds_are(echo, echo_models):
    from specdec_cli.measure.mode_kinds import mode_kinds, modes_help
    from specdec_cli.pairs.registry import drafter_kinds

    assert f"'{KIND}' ({WHAT})" in free_kinds.described()  # `--drafter`'s help, as the code builds it
    assert f"{KIND}:K ({WHAT})" in modes_help()  # `bench --modes`' help
    assert KIND in drafter_kinds() and KIND in free_kinds.beside_kinds() and KIND in mode_kinds()
    result = runner.invoke(app, ["models", "--models", echo_models, "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert rows["echo"]["draft"] == f"{KIND} ({WHAT})"
    assert rows["beside"]["draft"] == f"ngram (prompt lookup); {KIND} beside it under -k auto"


def test_the_new_kind_is_benched_and_equals_plain_decoding(echo, pair_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "abcabcabc abcabc", "scenario": "code"}\n')
    result = runner.invoke(app, ["bench", "--models", str(pair_dir / "models.yaml"), "--pair", "tiny-ngram",
                                 "--prompts", str(prompts), "--max-new-tokens", "10", "--json", "--modes", f"{KIND}:3"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert list(report["modes"]) == ["plain", f"{KIND}:3"]
    assert report["modes"][f"{KIND}:3"]["identical_to_plain"] is True
    assert set(report["modes"][f"{KIND}:3"]["drafters"]) == {KIND}  # it drafted, and was judged
    assert report["manifest"]["drafters"][KIND] == KIND


@pytest.mark.parametrize("options", [["--pair", "beside", "--drafter", KIND], ["--pair", "echo"]],
                         ids=["drafter", "draft"])
def test_the_new_kind_runs_token_for_token_as_plain_decoding(echo, echo_models, options):
    plain = generate(echo_models, *options, "-k", "0")
    drafted = generate(echo_models, *options, "-k", "3")
    assert drafted["token_ids"] == plain["token_ids"]
    assert drafted["stats"]["drafted"] > 0


@pytest.mark.parametrize("pair", ["echo", "beside"])
def test_the_adaptive_controller_prices_the_new_kind_free(echo, echo_models, pair):
    """Drafting alone or beside prompt lookup, its drafts cost no draft time in the controller's
    estimates: a ready draft, found for free, though the priors have no line for it."""
    from specdec_cli.decoding.control.priors import FREE_RATES
    from specdec_cli.decoding.loaded_pair import load_pair
    from specdec_cli.pairs.registry import load_registry
    from specdec_cli.pairs.tokenization import encode_prompt

    assert not any(name.startswith(KIND) for name in FREE_RATES)
    runtime = load_pair(load_registry(echo_models).pair(pair))
    ids = encode_prompt(runtime.tokenizer, "abcabcabc abcabc")
    plain = [t for e in runtime.engine.generate(ids, k=0, max_new_tokens=16) for t in e.emitted]
    schedule = runtime.controller(None).schedule(None)
    events = list(runtime.engine.generate(ids, k=schedule, max_new_tokens=16))
    assert [t for e in events for t in e.emitted] == plain
    assert any(e.source == KIND for e in events)
    assert schedule.standings[KIND].c == 0.0


def test_the_new_kind_is_refused_a_tree(echo, echo_models):
    result = runner.invoke(app, ["generate", "--models", echo_models, "--tree", "4", "abc"])
    assert one_line_error(result) == (f"--tree needs a draft head, and pair 'echo' drafts with '{KIND}'; "
                                      "choose its head with --drafter head")


def test_a_line_naming_a_class_without_for_pair_is_refused_by_the_class_name(monkeypatch):
    """Every free kind is built by its class's for_pair, which Drafter declares: a class that does not
    define it is named, not a bare AttributeError."""
    from specdec_cli.decoding.loaded_pair import free_drafter
    from specdec_cli.pairs.registry import DrafterSpec

    monkeypatch.setitem(free_kinds.FREE_KINDS, "beside", free_kinds.FreeKind(
        "beside", "free drafters beside another", "specdec_cli.decoding.drafters.beside:Beside"))
    with pytest.raises(TypeError, match=r"specdec_cli\.decoding\.drafters\.beside\.Beside defines no for_pair"):
        free_drafter(DrafterSpec(free_kind="beside"), 98)
