"""Every result names what computed it (kernels and their CPU path, the prompts' precision, threads),
and a calibration profile measured on other kernels is not used as if it were this run's."""

from __future__ import annotations

import json

import torch
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.pairs.profile import (PairProfile, ScenarioProfile, drafter_identity, kernels_mismatch,
                                       read_profiles, write_profile)
from specdec_cli.pairs.registry import load_registry

runner = CliRunner()
TORCH = f"torch-{torch.backends.cpu.get_cpu_capability().lower()}"  # what the tiny float32 pair runs on


def test_kernels_mismatch_compares_only_what_both_record():
    recorded = {"kernels": "specdec-avx512", "prefill": "bfloat16", "threads": 2}
    assert kernels_mismatch(recorded, {"kernels": "specdec-avx512", "prefill": "bfloat16", "threads": 1}) is None
    assert kernels_mismatch(recorded, {"kernels": "torch-avx2", "prefill": "bfloat16"}) == \
        "measured with kernels specdec-avx512, this run has torch-avx2"
    assert kernels_mismatch(recorded, {"kernels": "specdec-avx512", "prefill": "float32"}) == \
        "measured with prefill bfloat16, this run has float32"
    assert kernels_mismatch({}, {"kernels": "torch-avx2"}) is None  # a profile from before the record
    assert kernels_mismatch(recorded, {}) is None  # nothing loaded yet


def test_generate_json_names_the_kernels_prefill_and_threads(models):
    result = runner.invoke(app, ["generate", "--models", models, "--json", "-k", "2", "--threads", "1",
                                 "--max-new-tokens", "3", "abc"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stats"]["computed_by"] == {"kernels": TORCH, "prefill": "as decoding",
                                                                 "forward": "transformers", "threads": 1}


def tiny_profile(pair_dir, path, computed_by: dict):
    pair = load_registry(pair_dir / "models.yaml").pair("tiny")
    section = ScenarioProfile(k=2, verdict="speculate", best_k=2, speedup=1.5, alpha=0.8, c=0.01, verify_cost={2: 1.2})
    write_profile(path, PairProfile("tiny", "2026-12-03T09:00:00+00:00", str(pair.target.source),
                                    str(pair.drafter.model.source), {"default": section},
                                    drafter=drafter_identity(pair), computed_by=computed_by))


def test_a_profile_measured_on_other_kernels_is_one_warning_and_not_used(models, pair_dir, tmp_path):
    profile = tmp_path / "profile.yaml"
    tiny_profile(pair_dir, profile, {"kernels": "specdec-avx512", "prefill": "bfloat16", "threads": 2})
    args = ["generate", "--models", models, "--profile", str(profile), "-k", "auto", "--json", "--max-new-tokens", "2", "x"]
    result = runner.invoke(app, args, env={"COLUMNS": "60"})
    assert result.exit_code == 0, result.output
    assert result.stderr == (f"specdec: warning: {profile}: ignoring the profile of 'tiny': measured with kernels "
                             f"specdec-avx512, this run has {TORCH}; recalibrate with `specdec calibrate-k --write`\n")
    assert json.loads(result.stdout)["stats"]["profile"] is None

    tiny_profile(pair_dir, profile, {"kernels": TORCH, "prefill": "as decoding", "threads": 2})  # the same kernels
    result = runner.invoke(app, args)
    assert result.exit_code == 0 and result.stderr == "", result.output
    assert json.loads(result.stdout)["stats"]["profile"] == str(profile)


def test_bench_refuses_a_profile_from_other_kernels_and_records_its_own(models, pair_dir, tmp_path):
    profile = tmp_path / "profile.yaml"
    tiny_profile(pair_dir, profile, {"kernels": "torch-elsewhere", "prefill": "as decoding"})
    prompts = tmp_path / "p.txt"
    prompts.write_text("abcabc\n")
    result = runner.invoke(app, ["bench", "--models", models, "--prompts", str(prompts), "--modes", "auto",
                                 "--max-new-tokens", "4", "--profile", str(profile), "--json"])
    assert result.exit_code == 0, result.output
    assert "measured with kernels torch-elsewhere, this run has" in result.stderr
    manifest = json.loads(result.stdout)["manifest"]
    assert manifest["profile"] is None and manifest["computed_by"]["kernels"] == TORCH


def test_calibrate_writes_and_verify_reports_the_kernels(models, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("abcabc\n")
    profile = tmp_path / "profile.yaml"
    result = runner.invoke(app, ["calibrate-k", "--models", models, "--prompts", str(prompts), "--k", "0..2",
                                 "--max-new-tokens", "4", "--write", "--profile", str(profile), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["computed_by"]["kernels"] == TORCH
    assert read_profiles(profile)["tiny"].computed_by["kernels"] == TORCH
    result = runner.invoke(app, ["verify-equivalence", "--models", models, "--prompts", str(prompts), "-k", "2",
                                 "--max-new-tokens", "4", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["computed_by"] == {"kernels": TORCH, "prefill": "as decoding",
                                                        "forward": "transformers", "threads": torch.get_num_threads()}
