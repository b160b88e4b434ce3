"""The context limit, said plainly: an answer the target's context cut short says so (stats, live
view, stderr), and a prompt longer than the context is named with its line."""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from conftest import PROMPT, decode
from specdec_cli.cli import app
from specdec_cli.commands.live import LiveView
from specdec_cli.decoding.drafters import NgramDrafter
from specdec_cli.measure.run_stats import RunStats

runner = CliRunner()


@pytest.fixture
def models(pair_dir):
    return str(pair_dir / "models.yaml")


# --- the context limit -------------------------------------------------------------------------------


def test_engine_says_why_a_run_stopped(target, plain):
    """The last round says why the run ended: it did not, and an answer cut by the context looked ended."""
    tokens, events = decode(target, NgramDrafter(), 3, max_new_tokens=5)
    assert [e.stop for e in events[:-1]] == [None] * (len(events) - 1) and events[-1].stop == "max_new_tokens"
    eos = plain[3]
    tokens, events = decode(target, NgramDrafter(), 3, eos=(eos,))
    assert tokens[-1] == eos and events[-1].stop == "eos"
    long = PROMPT * 25  # 250 of the context's 256 tokens
    tokens, events = decode(target, NgramDrafter(), 3, prompt=long, eos=())
    assert len(tokens) == 6 and events[-1].stop == "context"
    tokens, events = decode(target, NgramDrafter(), 3, prompt=long, eos=(), max_new_tokens=6)
    assert events[-1].stop == "max_new_tokens"  # both limits at once: the one asked for
    stats = RunStats(3)
    for event in events:
        stats.add(event)
    assert stats.as_dict()["stop"] == "max_new_tokens"


def test_an_answer_cut_at_the_context_says_so(models):
    """stats.stop in --json, one warning line on stderr in text mode."""
    prompt = "x" * 250  # one token a character: 6 of the 256 are left
    result = runner.invoke(app, ["generate", "--models", models, "--json", "--max-new-tokens", "12", prompt])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)["stats"]
    assert (stats["stop"], stats["new_tokens"]) == ("context", 6)
    assert result.stderr == ""
    short = json.loads(runner.invoke(app, ["generate", "--models", models, "--json", "--max-new-tokens", "2", "hi"]).stdout)
    assert short["stats"]["stop"] in ("eos", "max_new_tokens")
    result = runner.invoke(app, ["generate", "--models", models, "--max-new-tokens", "12", prompt])
    assert result.exit_code == 0
    assert " ".join(result.stderr.split()) == ("specdec: warning: prompt 1: the answer stopped after 6 tokens, "
                                               "at the end of the target's 256-token context")


def test_live_view_shows_a_full_context():
    console = Console(width=120, record=True, force_terminal=True, color_system=None)
    stats = RunStats(3)
    stats.stop = "context"
    view = LiveView(console, None, "title")
    view.stats = stats
    assert "context full" in view._status().plain
    stats.stop = "eos"
    assert "context full" not in view._status().plain


def test_a_prompt_longer_than_the_context_is_named_with_its_line(models, tmp_path):
    """The error said the prompt's length alone: which of many prompts it was, the reader had to find."""
    lines = "ok\n\n" + "x" * 300 + "\n"
    result = runner.invoke(app, ["generate", "--models", models, "--json", "--max-new-tokens", "2"], input=lines)
    assert result.exit_code == 2
    assert [json.loads(line)["prompt"] for line in result.stdout.splitlines()] == ["ok"]  # the prompt before it
    assert " ".join(result.stderr.split()) == ("specdec: error: prompt 2 (stdin line 3): the prompt is 300 tokens; "
                                               "the target's context holds 256")
    lines = '{"id": "long", "prompt": "' + "x" * 300 + '"}\n'
    result = runner.invoke(app, ["generate", "--models", models, "--max-new-tokens", "2"], input=lines)
    assert result.exit_code == 2
    assert "specdec: error: prompt long (stdin line 1): the prompt is 300 tokens" in " ".join(result.stderr.split())


@pytest.mark.parametrize("command", [["bench", "--modes", "plain"], ["verify-equivalence", "-k", "1"],
                                     ["calibrate-k", "--k", "1"]])
def test_a_prompt_file_with_a_prompt_too_long_is_refused_naming_it_before_anything_runs(models, tmp_path, command):
    """It was met in the middle of the measuring, and named by its length alone."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ok\n" + "x" * 300 + "\n")
    result = runner.invoke(app, [*command, "--models", models, "--prompts", str(prompts), "--max-new-tokens", "2"])
    assert result.exit_code == 2, result.output
    assert " ".join(result.stderr.split()) == (f"specdec: error: prompt 2 ({prompts} line 2): the prompt is 300 tokens; "
                                               "the target's context holds 256")

