"""`specdec bench` on tiny models: every figure present, outputs compared with plain decoding."""

import json

import pytest
from typer.testing import CliRunner

from specdec_cli.bench import Mode, parse_modes
from specdec_cli.cli import app
from specdec_cli.errors import UserError

FIELDS = {
    "tokens_per_s", "speedup_vs_plain", "speedup_vs_hf_plain", "predicted_speedup", "acceptance_rate",
    "mean_accepted_length", "rounds", "completion_length", "ttft_s", "p50_token_latency_s",
    "p90_token_latency_s", "p99_token_latency_s", "identical_to_plain", "wall_s",
}
MODES = "plain,hf-plain,spec:3,hf-assisted:3,ngram:3,hf-lookup:3"


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "abcabcabc", "scenario": "code"}\n{"prompt": "hello there", "scenario": "chat"}\n')
    return path


def bench(pair_dir, prompt_file, *extra):
    return CliRunner().invoke(app, ["bench", "--models", str(pair_dir / "models.yaml"), "--prompts", str(prompt_file),
                                    "--max-new-tokens", "10", "--json", *extra])


def test_bench_reports_every_figure_for_every_mode_and_scenario(pair_dir, prompt_file):
    result = bench(pair_dir, prompt_file, "--modes", MODES)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert list(report["modes"]) == MODES.split(",")
    for figures in report["modes"].values():
        assert FIELDS <= set(figures)
        assert figures["identical_to_plain"] is True  # greedy: every mode gives the target's tokens
    assert set(report["scenarios"]) == {"code", "chat"}
    assert report["modes"]["plain"]["speedup_vs_plain"] == 1.0
    assert report["modes"]["spec:3"]["acceptance_rate"] > 0.5  # the similar draft agrees often
    assert report["modes"]["spec:3"]["predicted_speedup"] is not None
    assert report["modes"]["plain"]["mean_accepted_length"] == 1.0
    manifest = report["manifest"]
    assert manifest["target"]["files"] and manifest["libraries"]["transformers"]
    assert manifest["machine"]["torch_threads"] >= 1 and manifest["seed"] == 0


def test_bench_flags_a_mode_whose_tokens_differ(pair_dir, prompt_file, monkeypatch):
    import specdec_cli.engine as engine

    real = engine.greedy_accept

    def one_too_many(draft, logits):  # a broken verifier: lets one unverified draft token through
        n, token = real(draft, logits)
        return (n + 1, int(draft[n + 1]) if n + 1 < len(draft) else token) if n < len(draft) else (n, token)

    monkeypatch.setattr(engine, "greedy_accept", one_too_many)
    result = bench(pair_dir, prompt_file, "--modes", "plain,spec:3")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["modes"]["spec:3"]["identical_to_plain"] is False
    assert "modes whose tokens differ from plain decoding: spec:3" in result.stderr


def test_mode_parsing():
    assert parse_modes("ngram:4") == [Mode("plain"), Mode("ngram", 4)]  # plain is always measured
    for bad, message in [("warp:2", "unknown mode"), ("spec", "needs a K"), ("spec:0", "needs a K"), ("plain:3", "takes no K")]:
        with pytest.raises(UserError, match=message):
            parse_modes(bad)


def test_spec_mode_without_a_draft_model_is_a_user_error(pair_dir, prompt_file):
    result = bench(pair_dir, prompt_file, "--pair", "tiny-ngram", "--modes", "spec:2")
    assert result.exit_code == 2 and "needs a draft model" in result.stderr
