"""Managed vLLM servers, REAL ones: the bench starts vllm-plain and a server from a
--speculative-config file (`vllm-config:FILE`, here the shipped head exported as EAGLE-3), one of them is
killed in the middle (levels done are written, exit 3); a busy port and a bad model directory (one
error line naming the log, exit 2); in every case nothing left running. (specdec's own loop beside
a managed bench: test_llama_engine.py.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_cli.pairs.loading import transformers_directory
from specdec_cli.pairs.registry import load_registry
from specdec_cli.serving.server import free_port

from engine_support import (SERVER_THREADS, VLLM_SERVERS, assert_killed_run, assert_port_refused, busy_port, error_lines,
                            port_logs, require_vllm, servers_on_port, specdec, write_prompts)

pytestmark = VLLM_SERVERS

TIMEOUT = 600


@pytest.fixture(autouse=True)
def vllm_installed():
    require_vllm()


def _bench(prompts: Path, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "specdec_cli", "bench", "--engine", "vllm", "--prompts", str(prompts), "--port", str(port),
            "--max-new-tokens", "16", "--threads", str(SERVER_THREADS), *extra]


def test_a_config_file_servers_death_mid_bench_writes_the_levels_done_and_exits_3(eagle3_bench_killed):
    """The config file (the shipped head as EAGLE-3, K 3) names a server that dies while plain runs level 4
    (engine_support.eagle3_bench_killed_mid_run; test_export_vllm.py reads its drafts)."""
    run = eagle3_bench_killed
    result = assert_killed_run(run.code, run.lines, run.out, run.groups, run.mode, f"the vLLM server for {run.mode} died")
    assert result["modes"][run.mode]["1"]["acceptance"]["drafts"] > 0
    assert result["modes"]["vllm-plain"]["1"]["acceptance"]["drafts"] == 0
    arguments = result["manifest"]["engine"]["servers"][run.mode]["arguments"]
    assert json.loads(arguments[arguments.index("--speculative-config") + 1])["num_speculative_tokens"] == 3
    assert result["k_table"] == {}  # a config file's K is not one of a fixed mode's
    assert "own_loop" not in result  # the own loop runs only after a bench that finished


def test_busy_port_is_one_error_line_before_a_server_starts(tmp_path):
    with busy_port() as port:
        before = port_logs(port)
        done = subprocess.run(_bench(write_prompts(tmp_path), port, "--modes", "vllm-plain", "--concurrency", "1"),
                              capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)
    assert_port_refused(done, "vllm-plain", port, before)
    assert servers_on_port(port) == []


def test_bad_model_directory_is_one_error_line_naming_the_log(tmp_path):
    real = transformers_directory(load_registry(None).pair(None).target.source)
    broken = tmp_path / "broken-model"
    broken.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(real / name, broken / name)
    (broken / "config.json").write_text('{"architectures": ["NoSuchForCausalLM"], "model_type": "llama"}')
    (broken / "model.safetensors").write_bytes(b"")
    port = free_port()
    done = subprocess.run(_bench(write_prompts(tmp_path), port, "--modes", "vllm-plain", "--concurrency", "1",
                                 "--target", str(broken)), capture_output=True, text=True, timeout=TIMEOUT,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    errors = error_lines(done.stderr)
    assert len(errors) == 1 and "Traceback" not in done.stderr
    assert "exited with code" in errors[0] and "its log: " in errors[0]
    assert servers_on_port(port) == []


def test_an_empty_directory_is_refused_before_any_server_starts(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    done = specdec("bench", "--engine", "vllm", "--prompts", str(write_prompts(tmp_path)), "--target", str(empty),
                   timeout=120)
    assert done.returncode == 2
    assert error_lines(done.stderr) == [f"specdec: error: {empty} is not a model directory: missing config.json, "
                                        "weights (model.safetensors or pytorch_model.bin), a tokenizer (tokenizer.json "
                                        "or tokenizer.model)"]
