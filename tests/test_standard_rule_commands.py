"""``--accept standard`` outside the engine: lossless in every output (no LOSSY mark), its own modes in
`bench`, its sampled draws checked by distribution in verify-equivalence (the seed fixes no text that
plain sampling shares), and no K written by `calibrate-k --write`, which keeps K for the race."""

import json

import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from conftest import one_line_error
from specdec_cli.cli import app
from specdec_cli.commands.common import resolve_pair
from specdec_cli.commands.live import summary
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.decoding.rules import STANDARD, AcceptRule
from specdec_cli.measure import sampling_check
from specdec_cli.measure.loop_bench import Mode, parse_modes, with_rule
from specdec_cli.measure.run_stats import RunStats
from specdec_cli.pairs.tokenization import encode_prompt

runner = CliRunner()
STANDARD_RULE = AcceptRule(STANDARD)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models on a shared CPU: one torch thread keeps them fast and changes no result."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --- run statistics: lossless, no LOSSY mark ----------------------------------------------------------

@pytest.mark.parametrize("accept, lossless", [("exact", True), ("standard", True), ("top:3", False), ("lenient:1", False)])
def test_run_stats_ask_the_rule_whether_it_is_lossless(accept, lossless):
    stats = RunStats(3, accept).finish()
    assert stats.lossless is lossless and stats.as_dict()["lossless"] is lossless
    console = Console(record=True, width=300)
    console.print(summary(stats))
    assert ("LOSSY" in console.export_text()) is not lossless


def test_generate_under_the_standard_rule_reports_lossless_and_warns_nothing(pair_dir):
    result = runner.invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--max-new-tokens", "6", "--json",
                                 "--accept", "standard", "abcabc"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    stats = json.loads(result.stdout)["stats"]
    assert stats["lossless"] is True and stats["accept"] == "standard"


# --- bench: a standard mode is a mode of its own --------------------------------------------------------

def test_a_standard_mode_is_named_apart_and_brings_the_race_beside_it():
    standard = Mode("spec", 3, STANDARD_RULE)
    assert str(standard) == "spec:3@standard" and str(Mode("auto", 0, STANDARD_RULE)) == "auto@standard"
    assert parse_modes("spec:3@standard") == [Mode("plain"), Mode("spec", 3), standard]
    assert [str(m) for m in with_rule(parse_modes("plain,hf-plain,spec:3,ngram:2"), STANDARD_RULE)] == [
        "plain", "hf-plain", "spec:3", "ngram:2", "spec:3@standard", "ngram:2@standard"]
    assert with_rule(parse_modes("spec:3"), AcceptRule()) == parse_modes("spec:3")  # the default adds nothing


def test_bench_accept_standard_keys_its_modes_apart_lossless_and_unbilled(pair_dir, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "abcabcabc"}\n')
    result = runner.invoke(app, ["bench", "--models", str(pair_dir / "models.yaml"), "--prompts", str(prompts),
                                 "--max-new-tokens", "8", "--json", "--modes", "spec:3", "--accept", "standard"])
    assert result.exit_code == 0, result.output
    assert "lossy" not in result.stderr.lower()
    report = json.loads(result.stdout)
    assert list(report["modes"]) == ["plain", "spec:3", "spec:3@standard"]
    race, standard = report["modes"]["spec:3"], report["modes"]["spec:3@standard"]
    assert (race["accept"], standard["accept"]) == ("exact", "standard")
    assert race["lossless"] is True and standard["lossless"] is True
    assert standard["identical_to_plain"] is True  # greedy: the standard rule keeps the target's argmax
    assert report["lossy"] == {}


# --- verify-equivalence --sampling: by distribution -----------------------------------------------------

@pytest.fixture
def ngram_runtime(pair_dir):
    runtime = load_pair(resolve_pair(str(pair_dir / "models.yaml"), "tiny-ngram", None, None))
    return runtime, [("r", encode_prompt(runtime.tokenizer, "abcabcabcab", False))]


def test_the_standard_rules_draws_are_tested_against_transformers_per_k(ngram_runtime):
    runtime, prompts = ngram_runtime
    result = sampling_check.check_sampling(runtime.engine, runtime.tokenizer, prompts, [1, 2], 200, rule=STANDARD_RULE)
    assert result.runs == [] and result.divergences == []  # nothing compared seed by seed
    assert [(t.draws, t.statistic) for t in result.tests] == [
        (draws, statistic) for draws in ("plain", "K=1", "K=2") for statistic in ("first token", "first 2 tokens")]
    assert result.threshold == pytest.approx(0.01 / 6)
    assert result.drafted > 0 and result.passed, result.verdict()
    assert result.as_dict()["compared"] == "by distribution"
    assert "no evidence that plain sampling, speculative sampling and transformers' sampler differ" in result.verdict()


def test_a_biased_speculative_distribution_fails_the_check(ngram_runtime, monkeypatch):
    """Speculative draws that are always one continuation: only testing the K draws can see it (plain's are fine)."""
    real = sampling_check.draw

    def biased(engine, ids, k, n, first_seed, sampling, rule=AcceptRule()):
        samples, drafted, accepted = real(engine, ids, k, n, first_seed, sampling, rule)
        return (samples if k == 0 else [samples[0]] * n), drafted, accepted

    monkeypatch.setattr(sampling_check, "draw", biased)
    runtime, prompts = ngram_runtime
    result = sampling_check.check_sampling(runtime.engine, runtime.tokenizer, prompts, [2], 200, rule=STANDARD_RULE)
    p = {(t.draws, t.statistic): t.p_value for t in result.tests}
    assert min(p[("plain", s)] for s in sampling_check.STATISTICS) >= result.threshold
    assert max(p[("K=2", s)] for s in sampling_check.STATISTICS) < result.threshold
    assert not result.passed
    assert "plain sampling, speculative sampling and transformers' sampler differ: strong evidence" in result.verdict()


def test_verify_sampling_under_the_standard_rule_is_equivalent_by_distribution(pair_dir, tmp_path):
    prompts = tmp_path / "repeat.txt"
    prompts.write_text("abcabcabcab\n")
    args = ["verify-equivalence", "--models", str(pair_dir / "models.yaml"), "--pair", "tiny-ngram", "--prompts",
            str(prompts), "--k", "2", "--max-new-tokens", "4", "--sampling", "200", "--accept", "standard"]
    result = runner.invoke(app, args + ["--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["equivalent"] is True and data["lossless"] is True and data["accept"] == "standard"
    sampling = data["sampling"]
    assert sampling["compared"] == "by distribution" and sampling["seeded"] == 0 and sampling["divergences"] == []
    assert [t["draws"] for t in sampling["tests"]] == ["plain", "plain", "K=2", "K=2"]
    assert sampling["passed"] and sampling["drafted"] > 0
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "seeds against plain sampling" not in table.stdout
    assert "sampling: plain and speculative draws against transformers' sampler" in " ".join(table.stdout.split())


# --- calibrate-k --write keeps K for the race -------------------------------------------------------------

@pytest.mark.parametrize("accept, what", [("standard", "rule standard"), ("top:3", "lossy rule top:3")])
def test_calibrate_write_refuses_a_rule_other_than_the_race(pair_dir, tmp_path, accept, what):
    result = runner.invoke(app, ["calibrate-k", "--models", str(pair_dir / "models.yaml"), "--prompts",
                                 str(tmp_path / "none.txt"), "--write", "--accept", accept])
    lines = result.stderr.splitlines()
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert lines[-1] == ("specdec: error: --write keeps K for the default rule (exact), which -k auto runs; a K measured "
                         f"under the {what} is not written")
    if accept == "standard":  # lossless: no warning before the refusal
        assert one_line_error(result).startswith("--write keeps K")
