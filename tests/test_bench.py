"""`specdec bench` on tiny models: every figure present, outputs compared with plain decoding."""

import json

import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.errors import UserError
from specdec_cli.measure.loop_bench import Mode, parse_modes
from specdec_cli.pairs.profile import PairProfile, ScenarioProfile, drafter_identity, write_profile
from specdec_cli.pairs.registry import load_registry

FIELDS = {
    "tokens_per_s", "speedup_vs_plain", "speedup_vs_hf_plain", "predicted_speedup", "acceptance_rate",
    "mean_accepted_length", "rounds", "completion_length", "ttft_s", "p50_token_latency_s",
    "p90_token_latency_s", "p99_token_latency_s", "identical_to_plain", "wall_s", "fallback_forwards",
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
    assert report["modes"]["spec:3"]["predicted_speedup"] > 0  # from measured round costs (below)
    assert report["modes"]["plain"]["mean_accepted_length"] == 1.0
    manifest = report["manifest"]
    assert manifest["target"]["files"] and manifest["libraries"]["transformers"]
    assert manifest["machine"]["torch_threads"] >= 1 and manifest["seed"] == 0


def test_bench_flags_a_mode_whose_tokens_differ(pair_dir, prompt_file, monkeypatch):
    import specdec_cli.decoding.engine as engine

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
    assert parse_modes("auto,spec:2") == [Mode("plain"), Mode("auto"), Mode("spec", 2)]
    assert str(Mode("auto")) == "auto"
    for bad, message in [("warp:2", "unknown mode"), ("spec", "needs a K"), ("spec:0", "needs a K"), ("plain:3", "takes no K"),
                         ("auto:3", "takes no K")]:
        with pytest.raises(UserError, match=message):
            parse_modes(bad)


def test_spec_mode_without_a_draft_model_is_a_user_error(pair_dir, prompt_file):
    result = bench(pair_dir, prompt_file, "--pair", "tiny-ngram", "--modes", "spec:2")
    assert result.exit_code == 2
    assert " ".join(result.stderr.split()) == ("specdec: error: mode spec:2 needs a draft model, and pair 'tiny-ngram' has "
                                               "none (use --draft, or list one under `drafters:` in models.yaml)")


@pytest.mark.slow
def test_bench_runs_the_alternates_of_a_pair_drafted_by_ngram(pair_dir, prompt_file):
    """tiny-alt drafts by n-gram lookup by default; its draft model and head still get their modes."""
    result = bench(pair_dir, prompt_file, "--pair", "tiny-alt", "--modes", "spec:3,hf-assisted:3,head:2,ngram:3,ngram+spec:3,ngram+head:2")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert list(report["modes"]) == ["plain", "spec:3", "hf-assisted:3", "head:2", "ngram:3", "ngram+spec:3", "ngram+head:2"]
    # lookup first: some rounds draft by lookup, so the mix differs from either drafter alone
    assert report["modes"]["ngram+spec:3"]["acceptance_rate"] not in (report["modes"]["spec:3"]["acceptance_rate"],
                                                                      report["modes"]["ngram:3"]["acceptance_rate"])
    assert all(figures["identical_to_plain"] for figures in report["modes"].values())
    assert report["modes"]["spec:3"]["acceptance_rate"] > 0.5  # the similar draft, not n-gram lookup
    # the formula's α counts only the drafts the target tested: never below kept / drafted
    assert report["modes"]["spec:3"]["alpha"] > report["modes"]["spec:3"]["acceptance_rate"]
    same = json.loads(bench(pair_dir, prompt_file, "--pair", "tiny", "--modes", "spec:3,hf-assisted:3").stdout)
    for mode in ("spec:3", "hf-assisted:3"):  # the very figures of pair tiny, whose default is that draft model
        for key in ("acceptance_rate", "mean_accepted_length", "rounds"):
            assert report["modes"][mode][key] == same["modes"][mode][key] is not None
    manifest = report["manifest"]
    assert manifest["draft"] == "ngram"
    assert list(manifest["drafters"]) == ["model", "head", "ngram"]
    assert manifest["drafters"]["model"]["source"] == str(pair_dir.resolve() / "draft")
    assert manifest["drafters"]["model"]["files"]
    assert manifest["drafters"]["head"]["head"] == str(pair_dir.resolve() / "head")
    assert manifest["drafters"]["ngram"] == "ngram"


def test_default_modes_follow_the_pairs_drafters(pair_dir):
    from specdec_cli.commands.bench import _default_modes
    from specdec_cli.pairs.registry import load_registry, override

    registry = load_registry(pair_dir / "models.yaml")
    assert _default_modes(registry.pair("tiny-alt")) == "plain,hf-plain,ngram:4,hf-lookup:4,spec:4,hf-assisted:4,head:4"
    assert _default_modes(override(registry.pair("tiny-alt"), drafter="head")) == _default_modes(registry.pair("tiny-alt"))
    assert _default_modes(registry.pair("tiny")) == "plain,hf-plain,ngram:4,hf-lookup:4,spec:4,hf-assisted:4"
    assert _default_modes(registry.pair("tiny-ngram")) == "plain,hf-plain,ngram:4,hf-lookup:4"


# --- auto: adaptive K, seeded from the calibration profile ----------------------------------------


def write_tiny_profile(pair_dir, path, off: str, on: str):
    """A profile for pair tiny that says speculation is off for scenario ``off`` and pays at K=3 for ``on``."""
    pair = load_registry(pair_dir / "models.yaml").pair("tiny")
    costs = {1: 1.1, 2: 1.2, 3: 1.3}
    speculate = ScenarioProfile(k=3, verdict="speculate", best_k=3, speedup=1.6, alpha=0.8, c=0.01, verify_cost=costs)
    never = ScenarioProfile(k=0, verdict="off", best_k=1, speedup=0.9, alpha=0.05, c=0.01, verify_cost=costs)
    write_profile(path, PairProfile("tiny", "2025-01-01T00:00:00+00:00", str(pair.target.source),
                                    str(pair.drafter.model.source), {off: never, on: speculate},
                                    drafter=drafter_identity(pair)))


@pytest.mark.parametrize("off, on", [("code", "chat"), ("chat", "code")])
def test_auto_takes_each_scenarios_k_from_the_profile(pair_dir, prompt_file, tmp_path, off, on):
    profile = tmp_path / "profile.yaml"
    write_tiny_profile(pair_dir, profile, off, on)
    written = profile.read_bytes(), profile.stat().st_mtime_ns
    result = bench(pair_dir, prompt_file, "--modes", "spec:3,auto", "--profile", str(profile))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert list(report["modes"]) == ["plain", "spec:3", "auto"]
    auto = report["modes"]["auto"]
    assert FIELDS - {"speedup_vs_hf_plain"} | {"mean_k"} <= set(auto) and "mean_k" not in report["modes"]["spec:3"]
    assert auto["identical_to_plain"] is True
    assert auto["predicted_speedup"] is not None or auto["acceptance_rate"] is None  # per round: K may vary
    silent, drafting = report["scenarios"][off]["auto"], report["scenarios"][on]["auto"]
    assert silent["acceptance_rate"] is None and silent["mean_k"] == 0.0
    assert silent["rounds"] == silent["completion_length"]  # one prompt, one token a round: plain decoding
    # It starts at the profile's K=3; on tiny models the draft costs what the target does, so what
    # it measures may soon turn speculation off, and a random draft model's flat guesses seldom pass
    # the confidence gate: only the start is the profile's to decide.
    assert drafting["mean_k"] > 0
    assert report["manifest"]["profile"] == str(profile)
    assert (profile.read_bytes(), profile.stat().st_mtime_ns) == written  # read, never written


def test_auto_without_a_profile_starts_from_the_pairs_k(pair_dir, prompt_file, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_PROFILE", str(tmp_path / "none.yaml"))
    page = tmp_path / "bench.md"
    result = bench(pair_dir, prompt_file, "--modes", "auto", "--markdown", str(page))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["manifest"]["profile"] is None
    assert "| mean K |" in page.read_text()  # the K auto chose, a column of its own
    for scenario in ("code", "chat"):
        assert report["scenarios"][scenario]["auto"]["mean_k"] > 0
    assert report["modes"]["auto"]["identical_to_plain"] is True


def test_auto_with_a_missing_profile_file_is_a_user_error(pair_dir, prompt_file, tmp_path):
    missing = tmp_path / "nowhere.yaml"
    result = bench(pair_dir, prompt_file, "--modes", "auto", "--profile", str(missing))
    assert result.exit_code == 2
    assert result.stderr == f"specdec: error: profile file not found: {missing}\n"
    assert not missing.exists()


def test_the_running_drafter_takes_lookup_first_and_drafter_of_gives_it_bare(pair_dir, tmp_path):
    from specdec_cli.decoding.drafters.lookup import LookupFirst
    from specdec_cli.decoding.drafters.model import ModelDrafter
    from specdec_cli.decoding.loaded_pair import load_pair
    from specdec_cli.pairs.registry import load_registry

    models = tmp_path / "models.yaml"
    models.write_text(f"pairs:\n  p:\n    target: {pair_dir / 'target'}\n    draft: {{source: {pair_dir / 'draft'}, lookup: true}}\n")
    runtime = load_pair(load_registry(models).pair("p"))
    bare, draft = runtime.drafter_of("model")
    assert isinstance(runtime.drafter, LookupFirst) and runtime.drafter.learned is bare  # one model, loaded once
    assert isinstance(bare, ModelDrafter) and draft is runtime.draft


# --- predicted speed-up: measured round costs, each round's expected yield by drafter -------------


def test_predicted_speedup_counts_each_rounds_yield_by_drafter_and_position():
    """Lookup rounds keep all 3 drafts, head rounds none: modelled by drafter and position, the
    expected yield is what the rounds gave, so predicted equals measured; a single α at the mean K
    (1 + .75 + .75² + .75³ a round: 2.73 tokens, not 2.5) would be 9 % off."""
    from specdec_cli.measure.mode_figures import Sample, figures, predicted_from_rounds
    from specdec_cli.prompts import Prompt

    prompt = Prompt(1, "x")
    rounds = [("lookup", 3, 3)] * 10 + [("head", 3, 0)] * 10
    mode = Sample(prompt, [7] * 50, wall_s=2.0, ttft_s=0.1, latencies=[], rounds=20, drafts=rounds)
    plain = [Sample(prompt, [7] * 50, wall_s=4.0, ttft_s=0.1, latencies=[], rounds=50)]
    measured = figures([mode], plain)["speedup_vs_plain"]
    assert measured == 2.0
    assert predicted_from_rounds([mode], plain) == pytest.approx(measured)


def test_token_latency_percentiles_are_the_engine_benchs_interpolated_ones():
    """The loop bench's p50/p90/p99 interpolate between ranks as `vllm bench serve` (serving/stats.py):
    nearest rank would give 3, 4 and 4 ms here; no latencies at all give 0."""
    from specdec_cli.measure.mode_figures import Sample, figures
    from specdec_cli.prompts import Prompt

    mode = Sample(Prompt(1, "x"), [7] * 5, wall_s=1.0, ttft_s=0.1, latencies=[0.004, 0.001, 0.003, 0.002])
    got = figures([mode], [mode])
    assert [got[f"p{q}_token_latency_s"] for q in (50, 90, 99)] == [0.0025, 0.0037, 0.00397]
    one_token = Sample(Prompt(1, "x"), [7], wall_s=1.0, ttft_s=0.1, latencies=[])
    assert figures([one_token], [one_token])["p99_token_latency_s"] == 0.0


def test_a_modes_forwards_off_the_lean_forward_are_counted_and_warned(pair_dir, prompt_file, monkeypatch):
    from specdec_cli.measure import loop_bench as bench_module
    from specdec_cli.measure.mode_figures import Sample, figures
    from specdec_cli.prompts import Prompt

    plain = [Sample(Prompt(1, "x"), [7] * 4, wall_s=1.0, ttft_s=0.1, latencies=[], fallback_forwards=0)]
    slowed = [Sample(Prompt(1, "x"), [7] * 4, wall_s=1.0, ttft_s=0.1, latencies=[], fallback_forwards=3)]
    assert figures(slowed, plain)["fallback_forwards"] == 3 and figures(plain, plain)["fallback_forwards"] == 0

    real = bench_module.figures
    monkeypatch.setattr(bench_module, "figures", lambda samples, base: real(samples, base) | (
        {"fallback_forwards": 2} if samples and samples[0].drafts and samples[0].drafts[0][0] == "model" else {}))
    result = bench(pair_dir, prompt_file, "--modes", "plain,spec:3")
    assert result.exit_code == 0, result.output
    assert ("specdec: warning: target forwards ran transformers' forward instead of the lean int8/int4 one (slower): "
            "spec:3 2; fallback_forwards counts them") in result.stderr


def test_the_free_drafters_modes_run_exact_and_report_each_drafter(pair_dir, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join('{"prompt": "abcabcabc abcabc", "scenario": "code"}\n' for _ in range(3)))
    result = bench(pair_dir, prompts, "--pair", "tiny-ngram", "--modes", "recycle:3,suffix:3,auto-free,auto+free")
    assert result.exit_code == 0, result.output
    modes = json.loads(result.stdout)["modes"]
    assert list(modes) == ["plain", "recycle:3", "suffix:3", "auto-free", "auto+free"]
    assert all(figures["identical_to_plain"] for figures in modes.values())
    # the same prompt thrice: from the second on, the memory knows its answer
    assert {source.split("-")[0] for source in modes["suffix:3"]["drafters"]} == {"suffix"}
    assert modes["suffix:3"]["acceptance_rate"] > 0.5
    assert not {source.split("-")[0] for source in modes["auto-free"]["drafters"]} & {"recycle", "suffix"}
    for counts in modes["recycle:3"]["drafters"].values():
        assert counts["tokens_per_round"] == round((counts["accepted"] + counts["rounds"]) / counts["rounds"], 3)
    # each drafter's α (kept of judged, so at least kept of drafted) and its drafting seconds, as generate reports them
    for counts in [c for figures in modes.values() for c in figures.get("drafters", {}).values()]:
        assert set(counts) == {"rounds", "drafted", "accepted", "alpha", "tokens_per_round", "draft_s"}
        assert counts["accepted"] / counts["drafted"] <= counts["alpha"] <= 1 and counts["draft_s"] > 0
