"""The lossy report: bootstrap intervals on known data, the bill of a rule on hand-built samples, the
task set, and that every command flags lossy output (JSON, stderr, live summary, exit code)."""

import json

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.decoding.acceptance import AcceptRule
from specdec_cli.errors import UserError
from specdec_cli.commands.live import summary
from specdec_cli.measure import lossy
from specdec_cli.measure.loop_bench import Mode, parse_modes, with_rule
from specdec_cli.measure.mode_figures import Sample
from specdec_cli.measure.run_stats import RunStats
from specdec_cli.measure.tasks import TASKS, is_correct, make_tasks
from specdec_cli.prompts import Prompt

runner = CliRunner()
WARNING = "specdec: warning: --accept top:3 is lossy: the output is not the target's own, nor its sampled text fixed by the seed (lossless: false)"


def test_bootstrap_of_constant_data_is_a_point():
    data = np.full(20, 3.0)
    assert lossy.bootstrap_interval(lambda i: data[i].mean(), 20) == (3.0, 3.0, 3.0)


def test_bootstrap_interval_of_a_mean_matches_the_normal_approximation():
    data = np.random.default_rng(7).normal(10.0, 2.0, 400)
    value, low, high = lossy.bootstrap_interval(lambda i: data[i].mean(), 400, rounds=4000)
    assert value == pytest.approx(data.mean())
    half = 1.96 * data.std(ddof=1) / np.sqrt(400)  # 0.196
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)
    assert low < value < high


def test_paired_bootstrap_cancels_what_both_modes_share():
    """Prompts differ a lot, the lossy mode is 1.5× each one: pairing gives a tight interval at 1.5."""
    base = np.random.default_rng(0).uniform(10, 100, 30)
    lossy_ = 1.5 * base
    value, low, high = lossy.bootstrap_interval(lambda i: lossy_[i].sum() / base[i].sum(), 30)
    assert (value, low, high) == pytest.approx((1.5, 1.5, 1.5))
    unpaired = np.random.default_rng(1).permutation(lossy_)  # broken pairs: a wide interval
    _, low, high = lossy.bootstrap_interval(lambda i: unpaired[i].sum() / base[i].sum(), 30)
    assert high - low > 0.2


def _sample(prompt, tokens, rounds, accepted, wall, nll, correct=None):
    s = Sample(prompt, tokens, wall, 0.0, [], rounds=rounds, accepted=accepted)
    s.nll, s.correct = nll, correct
    return s


def test_compare_reports_the_known_bill():
    a, b = Prompt(1, "a", answer="5"), Prompt(2, "b")
    # lossless: 10 tokens in 5 rounds (ℓ* = 1), lossy: 12 tokens in 4 rounds (ℓ = 2)
    base = [_sample(a, [1] * 10, 5, 5, 2.0, 5.0, True), _sample(a, [1] * 10, 5, 5, 2.0, 5.0, True),
            _sample(b, [2] * 10, 5, 5, 2.0, 5.0), _sample(b, [2] * 10, 5, 5, 2.0, 5.0)]
    worse = [_sample(a, [1] * 12, 4, 8, 1.5, 12.0, False), _sample(a, [1] * 10, 5, 5, 2.0, 5.0, True),
             _sample(b, [3] * 12, 4, 8, 1.5, 12.0), _sample(b, [3] * 10, 5, 5, 2.0, 5.0)]
    got = lossy.compare(worse, base, draws=2)
    assert got["prompts"] == 2 and got["task_prompts"] == 1 and got["samples"] == 2
    value = {name: f["value"] for name, f in got.items() if isinstance(f, dict)}
    assert value["accepted_per_round"] == pytest.approx(26 / 18, abs=1e-4)
    assert value["accepted_per_round_lossless"] == 1.0
    assert value["per_round_gain"] == pytest.approx((26 / 18 + 1) / 2, abs=1e-4)
    assert value["length_ratio"] == pytest.approx(44 / 40)
    assert value["rounds_ratio"] == pytest.approx(18 / 20)
    assert value["wall_ratio"] == pytest.approx(7 / 8)
    assert value["tokens_per_s_ratio"] == pytest.approx((44 / 7) / (40 / 8), abs=1e-4)
    assert value["nll_change"] == pytest.approx(34 / 44 - 0.5, abs=1e-4)
    assert value["accuracy"] == 50.0 and value["accuracy_lossless"] == 100.0 and value["accuracy_change"] == -50.0
    assert value["identical_share"] == 0.25  # of the four runs only prompt a's second is the lossless text
    assert "per-round gain 1.22×" in lossy.headline("spec:3@top:3", got)


def test_parse_modes_with_rules_keeps_a_rules_comma_and_adds_the_lossless_twin():
    modes = parse_modes("head:3@typical:0.3,0.09,spec:3@lenient:2,ngram:2")
    assert [str(m) for m in modes] == ["plain", "head:3", "head:3@typical:0.3,0.09", "spec:3", "spec:3@lenient:2", "ngram:2"]
    assert modes[2].rule == AcceptRule("typical", (0.3, 0.09)) and modes[2].lossless_twin == Mode("head", 3)
    assert [str(m) for m in with_rule(parse_modes("plain,hf-plain,spec:3"), AcceptRule("top", (3.0,)))] == [
        "plain", "hf-plain", "spec:3", "spec:3@top:3"]


@pytest.mark.parametrize("text, message", [
    ("hf-plain@top:3", "mode 'hf-plain@top:3': a rule applies to this loop's speculative modes (spec, ngram, head, "
                       "ngram+spec, ngram+head, auto), not to plain decoding or transformers' generate"),
    ("plain@top:3", "mode 'plain@top:3': a rule applies to this loop's speculative modes (spec, ngram, head, "
                    "ngram+spec, ngram+head, auto), not to plain decoding or transformers' generate"),
    ("spec:3@top:0", "mode 'spec:3@top:0': rule 'top:0': expected exact, standard, lenient:L (L >= 1), typical:EPS,DELTA "
                     "(both in (0, 1]) or top:N (N >= 1)"),
])
def test_parse_modes_refuses_bad_rules(text, message):
    with pytest.raises(UserError) as error:
        parse_modes(text)
    assert str(error.value) == message


def test_tasks_are_seeded_and_checkable():
    tasks = make_tasks(8, seed=3)
    assert tasks == make_tasks(8, seed=3) and tasks != make_tasks(8, seed=4)
    assert [t["scenario"] for t in tasks[:4]] == [f"task-{kind}" for kind in TASKS]
    add = tasks[0]
    a, b = (int(x) for x in add["prompt"].removeprefix("What is ").split("?")[0].split(" + "))
    assert add["answer"] == str(a + b)
    assert is_correct("12", "7 + 5 = 12") and is_correct("12", "The answer is 12.")
    assert not is_correct("12", "7 + 5 = 13\n12") and not is_correct("12", "112")
    assert is_correct("Paris", "The capital of France is paris.") and not is_correct("Rome", "Romeo")


def test_live_summary_marks_lossy_output():
    console = Console(record=True, width=300)
    console.print(summary(RunStats(3, "top:3").finish()))
    assert console.export_text().startswith("LOSSY (top:3): not the target's own output · ")
    console = Console(record=True, width=300)
    console.print(summary(RunStats(3).finish()))
    assert "LOSSY" not in console.export_text()


def test_generate_with_a_lossy_rule_says_so(pair_dir):
    args = ["generate", "--models", str(pair_dir / "models.yaml"), "--max-new-tokens", "8", "--json", "abcabc"]
    result = runner.invoke(app, args + ["--accept", "top:3"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [WARNING]
    stats = json.loads(result.stdout)["stats"]
    assert stats["lossless"] is False and stats["accept"] == "top:3"
    exact = runner.invoke(app, args)
    assert exact.stderr == "" and json.loads(exact.stdout)["stats"]["lossless"] is True


def test_a_bad_rule_is_one_line_and_exit_2(pair_dir):
    result = runner.invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--accept", "top:x", "hi"])
    assert result.exit_code == 2
    assert result.stderr == ("specdec: error: --accept 'top:x': expected exact, standard, lenient:L (L >= 1), typical:EPS,DELTA "
                             "(both in (0, 1]) or top:N (N >= 1)\n")


def test_verify_equivalence_with_a_lossy_rule_runs_and_exits_1(pair_dir, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("abcabcabc\nhello\n")
    args = ["verify-equivalence", "--models", str(pair_dir / "models.yaml"), "--prompts", str(prompts), "-k", "3",
            "--max-new-tokens", "12", "--json"]
    result = runner.invoke(app, args + ["--accept", "top:3"])
    assert result.exit_code == 1, result.output
    assert result.stderr.splitlines()[0] == WARNING
    record = json.loads(result.stdout)
    assert record["lossless"] is False and record["accept"] == "top:3" and record["equivalent"] is False
    assert record["verdict"].startswith("NOT EQUIVALENT: lossy rule --accept top:3 (lossless: false); ")
    assert len(record["runs"]) == 2  # it ran every prompt
    exact = runner.invoke(app, args)
    assert exact.exit_code == 0 and json.loads(exact.stdout)["lossless"] is True


def test_bench_reports_a_lossy_mode_against_its_twin(pair_dir, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "abcabcabc"}\n{"prompt": "What is 2 + 3?", "answer": "5"}\n{"prompt": "hello"}\n')
    page = tmp_path / "lossy.md"
    result = runner.invoke(app, ["bench", "--models", str(pair_dir / "models.yaml"), "--prompts", str(prompts),
                                 "--max-new-tokens", "8", "--json", "--modes", "spec:3@top:3", "--samples", "2",
                                 "--temperature", "1", "--markdown", str(page)])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == ["specdec: warning: mode spec:3@top:3 is lossy: the output is not the "
                                          "target's own, nor its sampled text fixed by the seed (lossless: false)"]
    report = json.loads(result.stdout)
    assert list(report["modes"]) == ["plain", "spec:3", "spec:3@top:3"]
    assert report["modes"]["spec:3@top:3"]["lossless"] is False and report["modes"]["spec:3"]["lossless"] is True
    assert report["manifest"]["lossless"] is False and report["manifest"]["samples"] == 2
    bill = report["lossy"]["spec:3@top:3"]
    assert bill["against"] == "spec:3" and bill["rule"] == "top:3"
    assert bill["prompts"] == 3 and bill["task_prompts"] == 1 and bill["samples"] == 2
    for name in ("accepted_per_round", "per_round_gain", "length_ratio", "rounds_ratio", "wall_ratio",
                 "tokens_per_s_ratio", "nll_change", "accuracy_change", "identical_share"):
        assert bill[name]["low"] <= bill[name]["value"] <= bill[name]["high"], name
    text = page.read_text()
    assert "## Lossy rules against the same mode lossless" in text and "- `spec:3@top:3`: per-round gain" in text


def test_calibrate_k_with_a_lossy_rule_reports_length_and_quality(pair_dir, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("abcabcabc\nhello\n")
    args = ["calibrate-k", "--models", str(pair_dir / "models.yaml"), "--prompts", str(prompts), "-k", "0,2",
            "--max-new-tokens", "8", "--json"]
    result = runner.invoke(app, args + ["--accept", "top:3"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[0] == WARNING
    record = json.loads(result.stdout)
    assert record["lossless"] is False and record["accept"] == "top:3"
    plain, two = record["overall"]["per_k"]
    assert plain["length_ratio"] == 1.0 and two["length_ratio"] > 0 and plain["nll"] > 0 and two["nll"] > 0
    exact = json.loads(runner.invoke(app, args).stdout)
    assert exact["lossless"] is True and "nll" not in exact["overall"]["per_k"][1]
    refused = runner.invoke(app, args + ["--accept", "top:3", "--write"])
    assert refused.exit_code == 2 and refused.stderr.splitlines()[-1] == (
        "specdec: error: --write keeps K for the default rule (exact), which -k auto runs; a K measured under the lossy "
        "rule top:3 is not written")


LIGHT = r"""
import sys
from typer.testing import CliRunner
from specdec_cli.cli import app

for command in (["generate", "x"], ["bench", "--prompts", "p"], ["calibrate-k", "--prompts", "p"],
                ["verify-equivalence", "--prompts", "p"]):
    result = CliRunner().invoke(app, command + ["--accept", "top:0"])
    assert result.exit_code == 2 and result.stderr.startswith("specdec: error: --accept 'top:0': expected"), result.output
    assert "torch" not in sys.modules, command
"""


def test_a_bad_rule_is_refused_by_every_command_before_torch_loads():
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", LIGHT], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
