"""`specdec export --from-bench` without a calibration profile, and `--drafter` choosing which of
the pair's drafters the engine runs: K and the per-batch-size table come from the engine bench."""

import json

from typer.testing import CliRunner

from specdec_cli.cli import app


def bench(tmp_path, rows):
    modes: dict = {}
    for mode, level, speed in rows:  # the shape `specdec bench --engine vllm --json` writes
        modes.setdefault(mode, {})[str(level)] = {"output_tok_s": speed}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"levels": sorted({r[1] for r in rows}), "modes": modes}))
    return path


def export(pair_dir, tmp_path, *extra):
    nowhere = tmp_path / "no-profile.yaml"  # the default location, empty
    return CliRunner(env={"SPECDEC_PROFILE": str(nowhere)}).invoke(
        app, ["export", "--models", str(pair_dir / "models.yaml"), "--engine", "vllm", "--json", *extra])


def test_an_engine_bench_alone_is_enough_and_says_so(pair_dir, tmp_path):
    rows = [("vllm-plain", 1, 20.0), ("vllm-ngram:4", 1, 30.0), ("vllm-plain", 8, 80.0), ("vllm-ngram:4", 8, 60.0)]
    result = export(pair_dir, tmp_path, "--pair", "tiny-ngram", "--from-bench", str(bench(tmp_path, rows)))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["speculative_config"]["num_speculative_tokens_per_batch_size"] == [[1, 7, 4], [8, 256, 0]]
    assert report["scenario_ks"] == {}
    assert report["notes"][-1].startswith("a K 0 row stops the drafting, not the cost of the speculative path")
    assert any(note.startswith("no calibration profile of tiny-ngram in ") for note in report["notes"])
    assert report["profile"] is None  # what `watch --export` would judge drift against: nothing


def test_without_a_bench_a_profile_is_still_required(pair_dir, tmp_path):
    result = export(pair_dir, tmp_path, "--pair", "tiny-ngram")
    assert result.exit_code == 2 and "no profile of pair" in result.output


def test_drafter_picks_the_method_the_bench_measured(pair_dir, tmp_path):
    rows = [("vllm-plain", 1, 20.0), ("vllm-draft:3", 1, 30.0), ("vllm-ngram:4", 1, 25.0)]
    path = str(bench(tmp_path, rows))
    result = export(pair_dir, tmp_path, "--pair", "tiny-alt", "--from-bench", path, "--drafter", "model")
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)["speculative_config"]
    assert config["method"] == "draft_model" and config["model"] == str(pair_dir / "draft")
    assert config["num_speculative_tokens"] == 3
    result = export(pair_dir, tmp_path, "--pair", "tiny-alt", "--from-bench", path, "--drafter", "ngram")
    assert json.loads(result.stdout)["speculative_config"]["method"] == "ngram"
    result = export(pair_dir, tmp_path, "--pair", "tiny-ngram", "--from-bench", path, "--drafter", "head")
    assert result.exit_code == 2 and "--drafter head: pair tiny-ngram has no head drafter" in result.output
    result = export(pair_dir, tmp_path, "--pair", "tiny-alt", "--from-bench", path, "--drafter", "medusa")
    assert result.exit_code == 2 and "--drafter 'medusa': choose one of head, model, ngram" in result.output


def test_traffic_without_a_profile_is_refused(pair_dir, tmp_path):
    rows = [("vllm-plain", 1, 20.0), ("vllm-ngram:4", 1, 30.0)]
    result = export(pair_dir, tmp_path, "--pair", "tiny-ngram", "--from-bench", str(bench(tmp_path, rows)),
                    "--traffic", "code=1")
    assert result.exit_code == 2 and "--traffic folds the profile's scenario Ks" in result.output


def test_the_json_names_the_profile_it_used(pair_dir, tmp_path):
    from specdec_cli.pairs.profile import PairProfile, ScenarioProfile, drafter_identity, write_profile
    from specdec_cli.pairs.registry import load_registry

    pair = load_registry(pair_dir / "models.yaml").pair("tiny-ngram")
    section = ScenarioProfile(k=4, verdict="speculate", best_k=4, speedup=1.5, alpha=0.7, c=0.02, verify_cost={4: 1.4})
    profile = tmp_path / "profile.yaml"
    write_profile(profile, PairProfile("tiny-ngram", "2026-12-01T09:00:00+00:00", str(pair.target.source), "ngram",
                                       {"chat": section}, section, drafter=drafter_identity(pair)))
    result = export(pair_dir, tmp_path, "--pair", "tiny-ngram", "--profile", str(profile))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["profile"] == {"path": str(profile), "section": "tiny-ngram"}


def test_an_ngram_export_keeps_the_lookup_bounds_the_bench_measured(pair_dir, tmp_path):
    rows = [("vllm-plain", 1, 20.0), ("vllm-ngram:4", 1, 30.0), ("vllm-plain", 4, 70.0), ("vllm-ngram:4", 4, 60.0)]
    path = bench(tmp_path, rows)
    data = json.loads(path.read_text())
    measured = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    data["manifest"] = {"engine": {"servers": {"vllm-plain": {"arguments": ["--model", "m"]}, "vllm-ngram:4": {
        "arguments": ["--model", "m", "--speculative-config", json.dumps(measured)]}}}}
    path.write_text(json.dumps(data))
    result = export(pair_dir, tmp_path, "--pair", "tiny-ngram", "--from-bench", str(path))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    config = report["speculative_config"]
    assert (config["prompt_lookup_min"], config["prompt_lookup_max"]) == (2, 4)  # the pair's own are 1-3
    assert "prompt lookup 2-4 as the engine bench measured it (the pair's own bounds are 1-3)" in report["notes"]


def test_the_free_drafters_beside_the_pairs_drafter_are_named_as_not_exported(pair_dir, tmp_path):
    """A pair whose `-k auto` weighs a store beside prompt lookup exports its lookup, and says the store
    stays specdec's own rather than dropping it without a word."""
    models = tmp_path / "models.yaml"
    models.write_text(f"default: p\npairs:\n  p:\n    target: {pair_dir / 'target'}\n    draft: {{kind: ngram, free: [recycle, store]}}\n"
                      "    drafters: {store: answers.jsonl}\n")
    rows = [("vllm-plain", 1, 20.0), ("vllm-ngram:4", 1, 30.0)]
    result = CliRunner(env={"SPECDEC_PROFILE": str(tmp_path / "no-profile.yaml")}).invoke(
        app, ["export", "--models", str(models), "--engine", "vllm", "--json", "--from-bench", str(bench(tmp_path, rows))])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["speculative_config"]["method"] == "ngram"
    assert "what `-k auto` weighs beside the pair's drafter (recycle, store) is specdec's own: not exported" in report["notes"]
