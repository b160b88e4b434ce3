"""Ctrl-C, SIGTERM and the context limit, said plainly: an interrupted command exits 130 (SIGTERM: 143)
with one line saying what it kept, and an answer the target's context cut short says so (stats, live
view, stderr)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from rich.console import Console
from typer.testing import CliRunner

from conftest import PROMPT, decode
from specdec_cli.cli import app
from specdec_cli.commands.live import LiveView
from specdec_cli.decoding.drafters.lookup import NgramDrafter
from specdec_cli.measure.run_stats import RunStats

runner = CliRunner()
SPECDEC = [sys.executable, "-m", "specdec_cli"]
# The real entry point, with the pair's load made to last: the test interrupts it there.
SLOW_LOAD = """
import sys, time
from specdec_cli.decoding import loaded_pair
real = loaded_pair.load_pair
def slow(*args, **kwargs):
    pair = real(*args, **kwargs)
    print("loaded", file=sys.stderr, flush=True)
    time.sleep(120)
    return pair
loaded_pair.load_pair = slow
from specdec_cli.cli import main
main()
"""


@pytest.fixture(autouse=True)
def sigint_reaches_the_children():
    """A test run started in the background by a shell without job control (`(pytest &)`) ignores
    SIGINT, and a child inherits that: Ctrl-C would never reach specdec. A handler set here is reset
    to the default in every child, as a terminal's Ctrl-C finds it."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


STOPS = [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]  # Ctrl-C, and docker stop's


def start(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def interrupt(process: subprocess.Popen, sig: int = signal.SIGINT) -> tuple[int, str, str]:
    """SIGINT, as Ctrl-C sends it (or ``sig``); the exit code and what was left on stdout and stderr."""
    process.send_signal(sig)
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return process.returncode, out, err


# --- Ctrl-C ------------------------------------------------------------------------------------------


def test_ctrl_c_while_loading_the_pair_says_nothing_was_written(models):
    """It was exit 130 without a word."""
    process = start([sys.executable, "-c", SLOW_LOAD, "generate", "--models", models, "--json", "hello"])
    assert process.stderr.readline() == "loaded\n"
    code, out, err = interrupt(process)
    assert code == 130 and out == ""
    assert err.splitlines() == ["specdec: interrupted while loading the pair; nothing was written"]


def test_ctrl_c_between_prompts_says_how_many_were_answered_and_written(models):
    process = start([*SPECDEC, "generate", "--models", models, "--json", "--max-new-tokens", "3"])
    process.stdin.write("first\nsecond\n")
    process.stdin.flush()
    answered = [json.loads(process.stdout.readline())["prompt"] for _ in range(2)]
    assert answered == ["first", "second"]
    code, out, err = interrupt(process)  # it waits for a third prompt on stdin
    assert code == 130 and out == ""
    assert err.splitlines() == ["specdec: interrupted while reading the next prompt; "
                                "2 prompts answered, their results were written"]


@pytest.mark.parametrize("sig, code, word", STOPS, ids=["ctrl-c", "sigterm"])
def test_a_stop_after_an_answer_keeps_it_in_the_memory_file_and_says_so(models, tmp_path, sig, code, word):
    """Ctrl-C said "the memory file is left as it was" after save() had updated it. SIGTERM (docker stop,
    systemd, timeout) had no handler: the run died at once, the memory file never written, exit 143
    without a word."""
    path = tmp_path / "memory.json"
    process = start([*SPECDEC, "generate", "--models", models, "--pair", "tiny-alt", "--drafter", "suffix", "-k", "3",
                     "--json", "--max-new-tokens", "3", "--memory", str(path)])
    process.stdin.write("first\n")
    process.stdin.flush()
    assert json.loads(process.stdout.readline())["prompt"] == "first"
    stopped, out, err = interrupt(process, sig)  # it waits for a second prompt on stdin
    assert stopped == code and out == ""
    assert err.splitlines() == [f"specdec: {word} while reading the next prompt; 1 prompt answered, its result was "
                                f"written; {path} keeps this run's answers"]
    assert len(json.loads(path.read_text())["answers"]) == 1


def test_sigterm_before_any_answer_leaves_the_memory_file_as_it_was(models, tmp_path):
    path = tmp_path / "memory.json"
    path.write_text("")
    process = start([sys.executable, "-c", SLOW_LOAD, "generate", "--models", models, "--pair", "tiny-alt",
                     "--drafter", "suffix", "-k", "3", "--memory", str(path), "hello"])
    assert process.stderr.readline() == "loaded\n"
    code, out, err = interrupt(process, signal.SIGTERM)
    assert code == 143 and out == "" and path.read_text() == ""
    assert err.splitlines() == ["specdec: terminated while loading the pair; nothing was written"]


def test_ctrl_c_as_specdec_starts_is_one_line_not_a_traceback(models):
    """Caught while the command modules import (`-X importtime` says when typer has): it was a
    KeyboardInterrupt traceback."""
    process = start([sys.executable, "-X", "importtime", "-m", "specdec_cli", "generate", "--models", models, "-"])
    while "typer" not in (line := process.stderr.readline()):
        assert line, "specdec ended before it imported typer"
    code, out, err = interrupt(process)
    said = [line for line in err.splitlines() if not line.startswith("import time:")]
    assert code == 130 and out == "" and "Traceback" not in err
    assert len(said) == 1 and re.fullmatch(r"specdec: interrupted( while [a-z ]+)?; nothing was written", said[0]), said


class _Engine(BaseHTTPRequestHandler):
    """What `specdec watch` asks of a vLLM server: its model, and its metrics page."""

    def do_GET(self):
        pages = {"/v1/models": json.dumps({"data": [{"id": "tiny"}]}),
                 "/metrics": 'vllm:generation_tokens_total{engine="0"} 10\nvllm:num_requests_running{engine="0"} 0\n'}
        body = pages.get(self.path)
        self.send_response(200 if body else 404)
        self.end_headers()
        self.wfile.write((body or "").encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def engine_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("sig, code, word", STOPS, ids=["ctrl-c", "sigterm"])
def test_ctrl_c_ends_watch_with_130_and_what_it_showed(engine_url, sig, code, word):
    """It was exit 0, as if watching had ended by itself; SIGTERM, 143 without a word. Every command
    takes SIGTERM as it takes Ctrl-C (cli.py)."""
    process = start([*SPECDEC, "watch", engine_url, "--json", "--interval", "1"])
    assert json.loads(process.stdout.readline())["url"] == engine_url
    stopped, out, err = interrupt(process, sig)  # during the next reading's interval
    shown = 1 + len(out.splitlines())
    assert stopped == code
    assert err.splitlines() == [f"specdec: {word} while watching {engine_url}; "
                                + ("1 reading was shown" if shown == 1 else f"{shown} readings were shown")]


# --- the context limit -------------------------------------------------------------------------------


def test_engine_says_why_a_run_stopped(target, plain):
    """The last round says why the run ended: it did not, and an answer cut by the context looked ended."""
    tokens, events = decode(target, NgramDrafter(), 3, max_new_tokens=5)
    assert [e.stop for e in events[:-1]] == [None] * (len(events) - 1) and events[-1].stop == "max_new_tokens"
    eos = plain[3]
    tokens, events = decode(target, NgramDrafter(), 3, eos=(eos,))
    assert tokens[-1] == eos and events[-1].stop == "eos"
    long = PROMPT * 25  # 250 of the context's 256 tokens
    tokens, events = decode(target, NgramDrafter(), 3, prompt=long, eos=())
    assert len(tokens) == 6 and events[-1].stop == "context"
    tokens, events = decode(target, NgramDrafter(), 3, prompt=long, eos=(), max_new_tokens=6)
    assert events[-1].stop == "max_new_tokens"  # both limits at once: the one asked for
    stats = RunStats(3)
    for event in events:
        stats.add(event)
    assert stats.as_dict()["stop"] == "max_new_tokens"


def test_an_answer_cut_at_the_context_says_so(models):
    """stats.stop in --json, one warning line on stderr in text mode."""
    prompt = "x" * 250  # one token a character: 6 of the 256 are left
    result = runner.invoke(app, ["generate", "--models", models, "--json", "--max-new-tokens", "12", prompt])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)["stats"]
    assert (stats["stop"], stats["new_tokens"]) == ("context", 6)
    assert result.stderr == ""
    short = json.loads(runner.invoke(app, ["generate", "--models", models, "--json", "--max-new-tokens", "2", "hi"]).stdout)
    assert short["stats"]["stop"] in ("eos", "max_new_tokens")
    result = runner.invoke(app, ["generate", "--models", models, "--max-new-tokens", "12", prompt])
    assert result.exit_code == 0
    assert " ".join(result.stderr.split()) == ("specdec: warning: prompt 1: the answer stopped after 6 tokens, "
                                               "at the end of the target's 256-token context")


def test_live_view_shows_a_full_context():
    console = Console(width=120, record=True, force_terminal=True, color_system=None)
    stats = RunStats(3)
    stats.stop = "context"
    view = LiveView(console, None, "title")
    view.stats = stats
    assert "context full" in view._status().plain
    stats.stop = "eos"
    assert "context full" not in view._status().plain


def test_a_prompt_longer_than_the_context_is_named_with_its_line(models, tmp_path):
    """The error said the prompt's length alone: which of many prompts it was, the reader had to find.
    On stdin the stream goes on past it (tests/test_faults_stream.py), exit 1; on the command line, exit 2."""
    lines = "ok\n\n" + "x" * 300 + "\n"
    result = runner.invoke(app, ["generate", "--models", models, "--json", "--max-new-tokens", "2"], input=lines)
    assert result.exit_code == 1
    assert [json.loads(line).get("prompt") for line in result.stdout.splitlines()] == ["ok", None]  # then its error object
    assert " ".join(result.stderr.split()) == ("specdec: error: prompt 2 (stdin line 3): the prompt is 300 tokens; "
                                               "the target's context holds 256")
    lines = '{"id": "long", "prompt": "' + "x" * 300 + '"}\n'
    result = runner.invoke(app, ["generate", "--models", models, "--max-new-tokens", "2"], input=lines)
    assert result.exit_code == 1
    assert "specdec: error: prompt long (stdin line 1): the prompt is 300 tokens" in " ".join(result.stderr.split())
    result = runner.invoke(app, ["generate", "--models", models, "--max-new-tokens", "2", "x" * 300])
    assert result.exit_code == 2
    assert " ".join(result.stderr.split()) == ("specdec: error: prompt 1: the prompt is 300 tokens; "
                                               "the target's context holds 256")


@pytest.mark.parametrize("command", [["bench", "--modes", "plain"], ["verify-equivalence", "-k", "1"],
                                     ["calibrate-k", "--k", "1"]])
def test_a_prompt_file_with_a_prompt_too_long_is_refused_naming_it_before_anything_runs(models, tmp_path, command):
    """It was met in the middle of the measuring, and named by its length alone."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("ok\n" + "x" * 300 + "\n")
    result = runner.invoke(app, [*command, "--models", models, "--prompts", str(prompts), "--max-new-tokens", "2"])
    assert result.exit_code == 2, result.output
    assert " ".join(result.stderr.split()) == (f"specdec: error: prompt 2 ({prompts} line 2): the prompt is 300 tokens; "
                                               "the target's context holds 256")


def test_train_draft_says_when_its_checkpoint_is_kept(tmp_path):
    """Before training nothing is on disk; from training on (or with --resume) the checkpoint is."""
    from rich.progress import Progress

    from specdec_cli.commands import interrupt as said
    from specdec_cli.commands.train_draft import ProgressReporter

    reporter = ProgressReporter(Progress(disable=True), tmp_path / "checkpoint")
    reporter.phase("teacher pass", 3)
    assert said.line() == "interrupted while making the data (teacher pass); nothing was written"
    reporter.phase("training", 10)
    kept = f"{tmp_path / 'checkpoint'} keeps the data and the last saved training state: --resume continues it"
    assert said.line() == f"interrupted while training; {kept}"
    ProgressReporter(Progress(disable=True), tmp_path / "checkpoint", resume=True).phase("loading the target", None)
    assert said.line() == f"interrupted while loading the target; {kept}"


def test_ctrl_c_in_a_batch_waiting_for_the_pipe_keeps_every_answer_and_says_how_many(models):
    """A batch reads the pipe on a thread of its own: answers are written while it waits for the next
    line, and a stop there is the same one line."""
    process = start([*SPECDEC, "generate", "--models", models, "--json", "--dtype", "int8", "--batch", "3",
                     "--max-new-tokens", "4"])
    process.stdin.write("first\nsecond\n")
    process.stdin.flush()
    answered = [json.loads(process.stdout.readline())["prompt"] for _ in range(2)]
    assert answered == ["first", "second"]  # written though the batch is not full and stdin is open
    code, out, err = interrupt(process)
    assert code == 130 and out == ""
    assert err.splitlines() == ["specdec: interrupted while reading the next prompt; "
                                "2 prompts answered, their results were written"]


def test_a_stop_writes_the_finished_answers_that_wait_for_an_unfinished_one():
    from specdec_cli.commands.answering import InOrder

    written = []
    order = InOrder()
    places = [order.place() for _ in range(4)]
    order.done(places[1], lambda: written.append(1))
    order.done(places[3], lambda: written.append(3))
    assert written == []  # in input order: they wait for the first
    order.done(places[0], lambda: written.append(0))
    assert written == [0, 1]
    order.drain()  # a stop: what finished is written, in order, past the unfinished one
    assert written == [0, 1, 3]
