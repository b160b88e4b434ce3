"""The engine commands' user mistakes: one `specdec: error:` line and exit 2, answered before any
model or server is touched (no vLLM needed)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from engine_support import error_lines, write_prompts

from specdec_cli.errors import UserError


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec_cli", *args], capture_output=True, text=True, timeout=120,
                          env=os.environ | env, stdin=subprocess.DEVNULL)


@pytest.fixture
def prompts(tmp_path):
    return str(write_prompts(tmp_path))


@pytest.mark.parametrize("args, env, message", [
    (["bench", "--engine", "vllm"], {"SPECDEC_VLLM_ENV": "/nonexistent/vllm-env"},
     "vLLM is not installed at /nonexistent/vllm-env: run `bash install.sh vllm` (or point $SPECDEC_VLLM_ENV at a "
     "virtual environment that has it)"),
    (["bench", "--engine", "sglang"], {}, "--engine 'sglang': the engines specdec can start are vllm, llama.cpp"),
    (["bench", "--reference", "http://127.0.0.1:9"], {}, "--reference is the plain server --server is compared with: give --server too"),
    (["bench", "--engine", "vllm", "--server", "http://127.0.0.1:9"], {}, "--engine starts servers and --server attaches to one: give one of them"),
    (["bench", "--engine", "vllm", "--modes", "ngram:4"], {}, "--modes: unknown vllm mode 'ngram:4'; vllm modes are "
     "vllm-plain, vllm-ngram:K, vllm-draft:K, vllm-eagle3:K (K from 1 to 32) and vllm-config:FILE"),
    (["bench", "--engine", "vllm", "--concurrency", "1,x"], {}, "--concurrency '1,x': expected comma-separated positive integers"),
    (["bench", "--engine", "vllm", "--concurrency", "1", "--rate", "2"], {}, "--concurrency is a closed loop and --rate an open one: give one of them"),
    (["bench", "--engine", "vllm", "--slo", "ttft:fast"], {}, "--slo 'ttft:fast': expected ttft:MS, tpot:MS and/or e2el:MS, comma-separated"),
    (["verify-equivalence", "--engine", "vllm"], {}, "--engine vllm needs --spec ngram:K, draft:K or eagle3:K: the speculative server to check"),
    (["verify-equivalence", "--engine", "vllm", "--spec", "plain"], {}, "--spec 'plain': expected ngram:K, draft:K or eagle3:K (K from 1 to 32)"),
    (["verify-equivalence", "--server", "http://127.0.0.1:9"], {}, "--server is checked against a plain server: give --reference URL too"),
    (["verify-equivalence", "--engine", "vllm", "--spec", "ngram:4", "--concurrency", "4,0"], {},
     "--concurrency '4,0': expected comma-separated positive integers"),  # the same type as bench's
])
def test_engine_option_mistakes_are_one_line_and_exit_2(prompts, args, env, message):
    done = run(*args, "--prompts", prompts, **env)
    assert done.returncode == 2
    assert error_lines(done.stderr) == [f"specdec: error: {message}"] and "Traceback" not in done.stderr


def test_watch_names_a_server_that_does_not_answer():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = run("watch", f"http://127.0.0.1:{port}", "--once")
    assert done.returncode == 2
    assert error_lines(done.stderr) == [f"specdec: error: no server answers at http://127.0.0.1:{port}: [Errno 111] Connection refused"]
    bad = run("watch", "127.0.0.1:8000", "--once")
    assert error_lines(bad.stderr) == ["specdec: error: URL '127.0.0.1:8000': give a URL such as http://127.0.0.1:8000"]


LOOP = "applies to this loop's {}, not to a serving engine's (--engine, --server)"
ENGINE = "applies to a serving engine's {}: give --engine or --server"


@pytest.mark.parametrize("args, message", [
    (["bench", "--engine", "vllm", "--temperature", "0.7"], "--temperature " + LOOP.format("bench")),
    (["bench", "--server", "http://127.0.0.1:9", "--dtype", "int8"], "--dtype " + LOOP.format("bench")),
    (["bench", "--engine", "vllm", "--samples", "2"], "--samples " + LOOP.format("bench")),
    (["bench", "--server", "http://127.0.0.1:9", "--port", "8100"],
     "--port applies to the servers --engine starts, not to one at --server"),
    (["bench", "--concurrency", "1,4"], "--concurrency " + ENGINE.format("bench")),
    (["bench", "--loop-modes", "plain"], "--loop-modes " + ENGINE.format("bench")),
    (["bench", "--repeats", "1"], "--repeats " + ENGINE.format("bench")),  # given, even at its default
    (["verify-equivalence", "--engine", "vllm", "--spec", "ngram:3", "-k", "2"], "-k/--k " + LOOP.format("check")),
    (["verify-equivalence", "--server", "http://127.0.0.1:9", "--reference", "http://127.0.0.1:9", "--sampling", "10"],
     "--sampling " + LOOP.format("check")),
    (["verify-equivalence", "--concurrency", "8"], "--concurrency " + ENGINE.format("check")),
    (["verify-equivalence", "--spec", "ngram:3"], "--spec " + ENGINE.format("check")),
])
def test_an_option_the_chosen_branch_does_not_use_is_refused(prompts, args, message):
    done = run(*args, "--prompts", prompts)
    assert done.returncode == 2
    assert error_lines(done.stderr) == [f"specdec: error: {message}"] and "Traceback" not in done.stderr


def test_a_port_taken_after_the_check_is_still_told_from_the_engines_log(tmp_path):
    """The race check_port cannot close: the engine's own words for a busy port, in vLLM's and
    llama.cpp's wording, become the clue after 'exited with code'."""
    from specdec_cli.serving.server import _reason

    for words in ("OSError: [Errno 98] Address already in use", "couldn't bind HTTP server socket, hostname: 127.0.0.1"):
        log = tmp_path / "server.log"
        log.write_text(f"starting\n{words}\n")
        assert _reason(log) == " (its port is in use)"


def test_a_busy_port_the_user_chose_is_refused_before_the_engine_starts():
    from specdec_cli.serving.server import check_port

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(UserError, match=f"the server for vllm-plain cannot start: port {port} of 127.0.0.1 is in use"):
            check_port(port, "vllm-plain")
    check_port(port, "vllm-plain")  # free again


def test_a_busy_port_is_said_before_the_pairs_model_is_looked_at(tmp_path, prompts):
    """The ports --port gives the servers (the first mode's, then counting up) are checked before torch,
    the tokenizer or the target load: here the target does not exist, and the busy port is still the one
    error. The vLLM environment is a stand-in that only passes the installation check."""
    env = tmp_path / "vllm-env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)
    (env / "lib" / "python3" / "site-packages" / "vllm").mkdir(parents=True)
    (env / "lib" / "python3" / "site-packages" / "vllm" / "__init__.py").write_text("")
    models = tmp_path / "models.yaml"
    models.write_text(f"default: gone\npairs:\n  gone:\n    target: {tmp_path / 'no-such-model'}\n    draft: ngram\n")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        busy = holder.getsockname()[1]
        done = run("bench", "--engine", "vllm", "--models", str(models), "--modes", "vllm-plain,vllm-ngram:4",
                   "--port", str(busy - 1), "--prompts", prompts, SPECDEC_VLLM_ENV=str(env))
    assert done.returncode == 2, done.stderr
    assert error_lines(done.stderr) == [f"specdec: error: the server for vllm-ngram:4 cannot start: port {busy} of "
                                        "127.0.0.1 is in use (Address already in use); give another --port, "
                                        "or none for a free one"]
