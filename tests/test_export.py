"""`specdec export`: exact configs from a hand-made profile, the traffic fold, the bench table, the
transformers export loaded and used by generate, and the errors users make."""

import json

import pytest
import torch
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.errors import UserError
from specdec_cli.export.bench_table import Level, lookup_bounds, mode_k, table
from specdec_cli.export.fold import fold, parse_traffic
from specdec_cli.export.llama_flags import from_help
from specdec_cli.pairs.profile import PairProfile, ScenarioProfile, drafter_identity, write_profile
from specdec_cli.pairs.registry import load_registry

VERIFY = {1: 1.1, 2: 1.2, 3: 1.3, 4: 1.4, 5: 1.5}
CODE = ScenarioProfile(k=5, verdict="speculate", best_k=5, speedup=2.3, alpha=0.9, c=0.1, verify_cost=VERIFY)
CHAT = ScenarioProfile(k=2, verdict="speculate", best_k=2, speedup=1.3, alpha=0.55, c=0.1, verify_cost=VERIFY)
OVERALL = ScenarioProfile(k=4, verdict="speculate", best_k=4, speedup=1.8, alpha=0.8, c=0.1, verify_cost=VERIFY)


def hand_profile(pair, scenarios=None) -> PairProfile:
    return PairProfile(pair=pair.name, calibrated="2026-12-01T09:00:00+00:00", target=str(pair.target.source),
                       draft="draft", scenarios=scenarios or {"code": CODE, "chat": CHAT}, overall=OVERALL,
                       drafter=drafter_identity(pair))


@pytest.fixture
def setup(pair_dir, tmp_path):
    """The tiny pair (draft model) and a profile for it written by the profile writer."""
    pair = load_registry(pair_dir / "models.yaml").pair("tiny")
    path = tmp_path / "profile.yaml"
    write_profile(path, hand_profile(pair))
    return pair_dir, path


def export(pair_dir, profile, *extra, pair="tiny"):
    return CliRunner().invoke(app, ["export", "--models", str(pair_dir / "models.yaml"), "--pair", pair,
                                    "--profile", str(profile), *extra])


def mix_speedup(shares: dict, k: int) -> float:
    """The mix's speed-up written out independently: tokens over time, per token of each scenario."""
    sections = {"code": CODE, "chat": CHAT}
    time_per_token = 0.0
    for name, share in shares.items():
        s = sections[name]
        tokens = sum(s.alpha ** i for i in range(k + 1))
        time_per_token += share * ((VERIFY[k] + k * s.c) if k else 1.0) / tokens
    return 1 / time_per_token


# --- the fold ------------------------------------------------------------------------------------


def test_the_fold_picks_the_k_that_makes_the_mix_fastest_not_an_average(pair_dir):
    profile = hand_profile(load_registry(pair_dir / "models.yaml").pair("tiny"))
    folded = fold(profile, {"code": 0.6, "chat": 0.4})
    speeds = {k: mix_speedup({"code": 0.6, "chat": 0.4}, k) for k in range(6)}
    assert folded.k == max(speeds, key=speeds.get) == 3  # code alone wants 5, chat alone 2
    assert folded.speedup == pytest.approx(speeds[3])
    assert folded.describe() == "folded code 60% (K=5), chat 40% (K=2) into K=3, predicted 1.68x plain for the mix"
    assert fold(profile, {"code": 1.0}).k == 5 and fold(profile, {"chat": 1.0}).k == 2


def test_the_fold_says_off_when_no_k_beats_plain(pair_dir):
    pair = load_registry(pair_dir / "models.yaml").pair("tiny")
    poor = ScenarioProfile(k=0, verdict="off", best_k=1, speedup=0.8, alpha=0.05, c=0.5, verify_cost=VERIFY)
    folded = fold(hand_profile(pair, {"chat": poor}), {"chat": 1.0})
    assert folded.k == 0 and folded.speedup == 1.0
    assert "K=0 (speculation off" in folded.describe()


@pytest.mark.parametrize("text, shares", [("code=0.6,chat=0.4", {"code": 0.6, "chat": 0.4}),
                                          ("code=3, chat=1", {"code": 0.75, "chat": 0.25}),
                                          ("code=1e308,chat=1e308", {"code": 0.5, "chat": 0.5})])  # a sum past a float's top
def test_traffic_shares_are_normalised(text, shares):
    assert parse_traffic(text) == pytest.approx(shares)


@pytest.mark.parametrize("text, message", [("code", "SCENARIO=SHARE"), ("code=x", "SCENARIO=SHARE"), ("code=-1", "SCENARIO=SHARE"),
                                           ("=1", "SCENARIO=SHARE"), ("code=1,code=2", "twice"), ("code=0", "add up to 0")])
def test_bad_traffic_is_refused(text, message):
    with pytest.raises(UserError, match=message):
        parse_traffic(text)


# --- the bench's per-batch-size table ------------------------------------------------------------


def test_the_table_takes_the_fastest_k_per_level_and_merges_neighbours():
    levels = [Level(1, {0: 20, 2: 35, 3: 40}), Level(4, {0: 70, 3: 110}), Level(8, {0: 120, 2: 150, 3: 140}),
              Level(16, {0: 180, 3: 170})]
    assert table(levels) == [[1, 7, 3], [8, 15, 2], [16, 256, 0]]
    assert table([Level(1, {0: 10, 3: 30}), Level(2, {0: 20, 3: 50})]) == [[1, 256, 3]]
    assert mode_k("vllm-draft:3") == ("draft", 3) and mode_k("vllm-plain") == ("plain", 0) and mode_k("auto") is None


def bench_file(tmp_path):
    rows = [("vllm-plain", 1, 20.0), ("vllm-draft:3", 1, 40.0), ("vllm-draft:2", 1, 36.0), ("vllm-ngram:4", 1, 60.0),
            ("vllm-plain", 4, 70.0), ("vllm-draft:3", 4, 110.0), ("vllm-plain", 16, 180.0), ("vllm-draft:3", 16, 170.0)]
    path = tmp_path / "bench.json"
    modes: dict = {}
    for mode, level, speed in rows:  # the shape `specdec bench --engine vllm --json` writes
        modes.setdefault(mode, {})[str(level)] = {"output_tok_s": speed, "ttft": {"p50_ms": 10.0}}
    path.write_text(json.dumps({"levels": [1, 4, 16], "modes": modes, "k_table": {}}))
    return path


# --- the command's exact outputs -----------------------------------------------------------------


def test_vllm_export_from_the_profile_is_exact_and_warns_where_k_came_from(setup, tmp_path):
    pair_dir, profile = setup
    out = tmp_path / "spec.json"
    result = export(pair_dir, profile, "--engine", "vllm", "--out", str(out))
    assert result.exit_code == 0, result.output
    config = {"method": "draft_model", "model": str(pair_dir / "draft"), "num_speculative_tokens": 4}
    assert json.loads(out.read_text()) == config
    lines = result.stdout.splitlines()
    assert lines[0] == "# specdec export --engine vllm: pair tiny, K 4"
    assert "K 4 from specdec's own loop" in result.stdout and "WARNING" in result.stdout
    assert "predicts 1.85x at K 3, 1.87x at K 4, 1.84x at K 5" in result.stdout
    command = next(line for line in lines if line.startswith("python -m vllm"))
    assert command == (f"python -m vllm.entrypoints.openai.api_server --model {pair_dir / 'target'} --served-model-name tiny "
                       f"--speculative-config '{json.dumps(config, separators=(', ', ': '))}'")


def test_vllm_export_folds_the_traffic_and_says_so(setup):
    pair_dir, profile = setup
    result = export(pair_dir, profile, "--engine", "vllm", "--traffic", "code=0.6,chat=0.4", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["k"] == 3 and report["speculative_config"]["num_speculative_tokens"] == 3
    assert report["notes"][1] == "folded code 60% (K=5), chat 40% (K=2) into K=3, predicted 1.68x plain for the mix"


def test_vllm_export_from_an_engine_bench_writes_the_per_batch_size_table(setup, tmp_path):
    pair_dir, profile = setup
    result = export(pair_dir, profile, "--engine", "vllm", "--from-bench", str(bench_file(tmp_path)), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["speculative_config"] == {"method": "draft_model", "model": str(pair_dir / "draft"), "num_speculative_tokens": 3,
                                            "num_speculative_tokens_per_batch_size": [[1, 15, 3], [16, 256, 0]]}
    assert report["origin"].startswith("K 3 from the engine bench") and "2.00x its plain decoding" in report["origin"]
    assert "WARNING" not in report["origin"]


def test_ngram_pair_exports_prompt_lookup_bounds(pair_dir, tmp_path):
    pair = load_registry(pair_dir / "models.yaml").pair("tiny-ngram")
    profile = tmp_path / "p.yaml"
    write_profile(profile, hand_profile(pair))
    result = export(pair_dir, profile, "--engine", "vllm", "--json", pair="tiny-ngram")
    assert json.loads(result.stdout)["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    result = export(pair_dir, profile, "--engine", "sglang", pair="tiny-ngram")
    assert "--speculative-algorithm NGRAM --speculative-num-draft-tokens 5 --speculative-ngram-min-match-window-size 1 " \
           "--speculative-ngram-max-match-window-size 3" in result.stdout


def test_sglang_export_of_a_draft_model(setup):
    pair_dir, profile = setup
    result = export(pair_dir, profile, "--engine", "sglang")
    assert result.exit_code == 0, result.output
    assert (f"python -m sglang.launch_server --model-path {pair_dir / 'target'} --speculative-algorithm STANDALONE "
            f"--speculative-draft-model-path {pair_dir / 'draft'} --speculative-num-steps 4 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 5") in result.stdout.splitlines()


def test_llama_cpp_export_uses_the_documented_names_without_a_binary(setup, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("SPECDEC_LLAMA_SERVER", "/nonexistent/llama-server")
    pair_dir, profile = setup
    result = export(pair_dir, profile, "--engine", "llama.cpp")
    assert result.exit_code == 0, result.output
    assert "documented 2026 ones (no llama-server built (bash install.sh llama.cpp) or on PATH" in result.stdout
    assert (f"llama-server -m {pair_dir / 'target'} --spec-type draft-simple --spec-draft-model {pair_dir / 'draft'} "
            "--spec-draft-n-max 4 --spec-draft-n-min 0 --spec-draft-p-min 0") in result.stdout.splitlines()
    assert "convert_hf_to_gguf.py" in result.stdout  # a directory target is not what llama-server loads


def test_llama_server_help_decides_the_flag_names():
    legacy = from_help("  -md, --model-draft FNAME\n  --draft-max, --draft, --draft-n N\n  --draft-min N\n  --draft-p-min P\n", "llama-server")
    assert (legacy.model_draft, legacy.n_max, legacy.p_min, legacy.current) == ("--model-draft", "--draft-max", "--draft-p-min", False)
    current = from_help("--spec-type TYPES\n--spec-draft-model FNAME\n--spec-draft-n-max N\n", "llama-server")
    assert (current.model_draft, current.n_max, current.current) == ("--spec-draft-model", "--spec-draft-n-max", True)
    assert not current.ngram_length and not legacy.ngram_length  # no --spec-ngram-mod-n-max: ngram-simple with --draft-max
    assert from_help("--spec-draft-n-max N\n--spec-ngram-mod-n-max N\n", "llama-server").ngram_length
    assert "documented" in from_help("usage: nothing about drafts", "llama-server").source


def test_transformers_export_loads_and_generate_uses_it(setup, tmp_path):
    from transformers import AutoModelForCausalLM, GenerationConfig

    pair_dir, profile = setup
    out = tmp_path / "generation_config.json"
    result = export(pair_dir, profile, "--engine", "transformers", "--out", str(out))
    assert result.exit_code == 0, result.output
    config = GenerationConfig.from_pretrained(str(out.parent), config_file_name=out.name)
    assert (config.num_assistant_tokens, config.num_assistant_tokens_schedule, config.assistant_confidence_threshold,
            config.do_sample) == (4, "constant", 0.0, False)
    target = AutoModelForCausalLM.from_pretrained(pair_dir / "target").eval()
    assistant = AutoModelForCausalLM.from_pretrained(pair_dir / "draft").eval()
    ids = torch.tensor([[0, 40, 41, 42, 40, 41]])
    plain = target.generate(ids, max_new_tokens=12, do_sample=False)
    assisted = target.generate(ids, generation_config=config, assistant_model=assistant, max_new_tokens=12)
    assert assisted.tolist() == plain.tolist()
    assert f"GenerationConfig.from_pretrained({str(tmp_path)!r}, config_file_name='generation_config.json')" in result.stdout
    assert "assistant_model=assistant" in result.stdout and "k_by_scenario = {'code': 5, 'chat': 2}" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["--engine", "tgi"], "specdec: error: unknown engine 'tgi'; choose one of vllm, sglang, llama.cpp, transformers"),
    (["--engine", "vllm", "--traffic", "code=lots"], "specdec: error: --traffic takes SCENARIO=SHARE"),
    (["--engine", "vllm", "--traffic", "poetry=1"], "specdec: error: --traffic names scenario 'poetry', which profile"),
    (["--engine", "vllm", "--from-bench", "/nonexistent.json"], "specdec: error: --from-bench file not found"),
])
def test_user_mistakes_are_one_line_and_exit_2(setup, args, message):
    pair_dir, profile = setup
    result = export(pair_dir, profile, *args)
    assert result.exit_code == 2
    assert result.stderr.strip().startswith(message) and len(result.stderr.strip().splitlines()) == 1


def test_a_pair_without_a_profile_says_how_to_make_one(pair_dir, tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("pairs: {}\n")
    result = export(pair_dir, empty, "--engine", "vllm")
    assert result.exit_code == 2 and "specdec calibrate-k --pair tiny --prompts FILE --write" in result.stderr


def test_a_bench_without_the_pairs_method_is_refused(setup, tmp_path):
    pair_dir, profile = setup
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"levels": [1], "modes": {"vllm-plain": {"1": {"output_tok_s": 20}},
                                                         "vllm-ngram:4": {"1": {"output_tok_s": 30}}}}))
    result = export(pair_dir, profile, "--engine", "vllm", "--from-bench", str(path))
    assert result.exit_code == 2 and "no concurrency level with both the engine's plain mode and a draft_model mode" in result.stderr


def test_the_lookup_bounds_are_those_of_the_server_whose_k_was_chosen():
    def server(k, low, high):
        config = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": low, "prompt_lookup_max": high}
        return {"arguments": ["--port", "1", "--speculative-config", json.dumps(config)]}

    data = {"manifest": {"engine": {"servers": {"vllm-plain": {"arguments": ["--port", "2"]},
                                                "vllm-ngram:2": server(2, 1, 3), "vllm-ngram:4": server(4, 2, 5)}}}}
    assert lookup_bounds(data, 4) == (2, 5) and lookup_bounds(data, 2) == (1, 3)
    assert lookup_bounds(data, 0) == (1, 3)  # plain won the first level: the smallest K's server
    assert lookup_bounds({"manifest": {}}, 4) is None
