"""Numeric options checked for finiteness and range before anything runs (issue 65, cases 7, 8 and 10):
nan, inf, a seed outside 64 bits and thousands of threads are one `specdec: error:` line naming the
option and its range, exit code 2; and `watch` never prints the password of a URL it is given."""

from __future__ import annotations

import base64
import http.server
import json
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.commands import common
from specdec_cli.decoding.rules import RULE_SYNTAX
from specdec_cli.runtime import threads as thread_policy
from specdec_cli.serving import server as server_module

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()

LAST_SEED = 2**64 - 1
MOST_THREADS = thread_policy.most_threads()
GENERATE = ["generate", "x"]
BENCH = ["bench", "--prompts", "p.txt"]
CALIBRATE = ["calibrate-k", "--prompts", "p.txt"]
VERIFY = ["verify-equivalence", "--prompts", "p.txt"]
TRAIN = ["train-draft", "--out", "{out}", "--kind", "head", "--prompts", "p.txt", "--steps", "1"]
WATCH = ["watch", "http://127.0.0.1:9", "--once"]
SEEDED = {"generate": GENERATE, "bench": BENCH, "calibrate-k": CALIBRATE, "verify": VERIFY, "train-draft": TRAIN}


def seed_cases():
    for name, command in SEEDED.items():
        for seed in (2**70, 2**64, -1):
            yield pytest.param([*command, "--seed", str(seed)],
                               f"--seed must be from 0 to {LAST_SEED} (seeds are 64 bits), got {seed}", id=f"{name}-seed-{seed}")
    yield pytest.param([*BENCH, "--samples", "2", "--seed", str(LAST_SEED)],
                       f"--seed must be from 0 to {LAST_SEED - 1} with --samples 2 (seeds are 64 bits), got {LAST_SEED}",
                       id="bench-samples-past-the-last-seed")
    yield pytest.param([*VERIFY, "--sampling", "3", "--seed", str(LAST_SEED - 1)],
                       f"--seed must be from 0 to {LAST_SEED - 2} with --sampling 3 (seeds are 64 bits), got {LAST_SEED - 1}",
                       id="verify-sampling-past-the-last-seed")


def thread_cases():
    for name, command in SEEDED.items():
        for threads in (MOST_THREADS + 1, 60_000):
            yield pytest.param([*command, "--threads", str(threads)],
                               f"--threads must be from 1 to {MOST_THREADS} ({thread_policy.THREADS_PER_CORE} per core here), got {threads}",
                               id=f"{name}-threads-{threads}")


def float_cases():
    for name, command in (("generate", GENERATE), ("bench", BENCH), ("calibrate-k", CALIBRATE)):
        for value in ("nan", "inf"):
            yield pytest.param([*command, "--temperature", value], f"--temperature must be 0 or more and finite, got {value}",
                               id=f"{name}-temperature-{value}")
        yield pytest.param([*command, "--accept", "lenient:inf"],
                           f"--accept 'lenient:inf': its numbers must be finite; expected {RULE_SYNTAX}", id=f"{name}-lenient-inf")
    yield pytest.param([*GENERATE, "--temperature", "1e-320"], "--temperature must be 0 (greedy) or 1e-06 or more, got 1e-320",
                       id="generate-temperature-underflows")
    yield pytest.param([*VERIFY, "--accept", "lenient:1e999"],
                       f"--accept 'lenient:1e999': its numbers must be finite; expected {RULE_SYNTAX}", id="verify-lenient-overflows")
    for value in ("nan", "inf", "1e-320"):
        yield pytest.param([*VERIFY, "--sampling", "2", "--temperature", value],
                           f"--temperature must be 1e-06 or more and finite, got {value}", id=f"verify-temperature-{value}")
        yield pytest.param([*TRAIN, "--temperature", value], f"--temperature must be 1e-06 or more and finite, got {value}",
                           id=f"train-draft-temperature-{value}")
    for value in ("nan", "inf"):
        yield pytest.param([*VERIFY, "--tolerance", value], f"--tolerance must be above 0 and finite, got {value}",
                           id=f"verify-tolerance-{value}")
        yield pytest.param([*TRAIN, "--minutes", value], f"--minutes must be 0 or more and finite, got {value}",
                           id=f"train-draft-minutes-{value}")
    for value in ("nan", "inf", "0.0"):
        yield pytest.param([*TRAIN, "--lr", value], f"--lr must be above 0 and finite, got {value}", id=f"train-draft-lr-{value}")
    for value in ("nan", "inf", "1e+300"):
        yield pytest.param([*WATCH, "--interval", value], f"--interval must be in (0, 86400], got {value}",
                           id=f"watch-interval-{value}")


@pytest.fixture
def nothing_runs(monkeypatch):
    """Fails the command that gets past its option checks: to choosing its threads (just before torch
    and the model load), to reading models.yaml, or to asking a server."""

    def went_on(*args, **kwargs):
        raise AssertionError("the command went on past its option checks")

    monkeypatch.setattr(thread_policy, "apply", went_on)
    monkeypatch.setattr(common, "load_registry", went_on)
    monkeypatch.setattr(server_module, "attach", went_on)


@pytest.mark.parametrize("args, message", [*seed_cases(), *thread_cases(), *float_cases()])
def test_a_bad_number_is_one_line_before_anything_runs(args, message, tmp_path, nothing_runs):
    out = tmp_path / "out"
    result = runner.invoke(app, [arg.replace("{out}", str(out)) for arg in args])
    assert result.exit_code == 2, result.output
    assert result.stderr == f"specdec: error: {message}\n"
    assert result.stdout == "" and not out.exists()


LIGHT = r"""
import sys
from typer.testing import CliRunner
from specdec_cli.cli import app

for args in (["generate", "--temperature", "nan", "x"], ["generate", "--seed", str(2**64), "x"],
             ["generate", "--threads", "60000", "x"], ["watch", "--interval", "inf"],
             ["generate", "--accept", "lenient:inf", "x"]):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and result.stderr.startswith("specdec: error:"), (args, result.output)
    assert "torch" not in sys.modules, args
"""


def test_the_refusals_come_before_torch_is_imported():
    done = subprocess.run([sys.executable, "-c", LIGHT], capture_output=True, text=True, check=False, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def test_verify_samples_the_last_seeds_that_64_bits_hold(pair_dir, tmp_path):
    """transformers' reference draws take seeds a million past the race's: at the top of the range
    they wrap instead of overflowing torch's generator (a ValueError traceback)."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("abcabcabcab\n")
    result = runner.invoke(app, ["verify-equivalence", "--models", str(pair_dir / "models.yaml"), "--pair", "tiny-ngram",
                                 "--prompts", str(prompts), "-k", "2", "--max-new-tokens", "2", "--sampling", "2",
                                 "--seed", str(LAST_SEED - 1), "--threads", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["sampling"]["seeded"] == 2


# --- watch and a URL's password ------------------------------------------------------------------------

MODELS = json.dumps({"data": [{"id": "m"}]})
PROMETHEUS = "vllm:num_requests_running 0\n"
CREDENTIALS = "Basic " + base64.b64encode(b"opsuser:s3cret pw").decode()


class _Guarded(http.server.BaseHTTPRequestHandler):
    """An engine's two pages behind HTTP Basic auth (opsuser, 's3cret pw'); 401 without it."""

    def do_GET(self):
        body = {"/v1/models": MODELS, "/metrics": PROMETHEUS}.get(self.path)
        if self.headers.get("Authorization") != CREDENTIALS:
            self.send_error(401)
        elif body is None:
            self.send_error(404)
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@contextmanager
def guarded_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Guarded)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_watch_never_prints_the_password_of_a_server_that_does_not_answer():
    port = closed_port()
    result = runner.invoke(app, ["watch", f"http://opsuser:s3cret%20pw@127.0.0.1:{port}/", "--once"])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"specdec: error: no server answers at http://127.0.0.1:{port}: ")
    assert "s3cret" not in result.output and "opsuser" not in result.output


@pytest.mark.parametrize("given, shown", [("ftp://opsuser:s3cret@example.org/", "ftp://example.org/"),
                                          ("opsuser:s3cret@example.org:8000", "example.org:8000")])
def test_watch_names_its_argument_as_given_without_the_password(given, shown):
    result = runner.invoke(app, ["watch", given, "--once"])
    assert result.exit_code == 2, result.output
    assert result.stderr == f"specdec: error: URL '{shown}': give a URL such as http://127.0.0.1:8000\n"


def test_watch_sends_a_urls_password_as_basic_auth_and_prints_the_url_without_it():
    with guarded_server() as port:
        result = runner.invoke(app, ["watch", f"http://opsuser:s3cret%20pw@127.0.0.1:{port}", "--once", "--json",
                                     "--interval", "0.01"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["url"] == f"http://127.0.0.1:{port}"
    assert "s3cret" not in result.output


def test_a_manifests_command_line_leaves_out_a_urls_password(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["specdec", "bench", "--prompts", "p.txt", "--server", "http://opsuser:pw@host:8000",
                                      "--reference=https://opsuser:pw@host:8001/v1"])
    assert common.invocation("bench")["command"] == \
        "specdec bench --prompts p.txt --server http://host:8000 --reference=https://host:8001/v1"
