"""What the real-engine tests share: vLLM's environment and llama.cpp's server present (missing → the
test FAILS, unless a developer asked to skip them), running specdec as a subprocess, and checks that
no server outlived its test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_cli.errors import UserError
from specdec_cli.serving import environment
from specdec_cli.serving.server import group_members

SKIP_VAR = "SPECDEC_SKIP_VLLM_TESTS"  # a developer's quick run: the real-vLLM tests skip instead of failing
LLAMA_SKIP_VAR = "SPECDEC_SKIP_LLAMA_TESTS"  # the same for the real llama.cpp tests

# Prompts that repeat themselves, so that prompt lookup (vLLM's ngram) finds drafts within 16 tokens.
PROMPTS = [
    {"id": "copy-1", "prompt": "Repeat this line three times: the quick brown fox jumps over the lazy dog."},
    {"id": "copy-2", "prompt": "Write the word list again exactly: apple, banana, cherry, apple, banana, cherry, apple, banana."},
    {"id": "copy-3", "prompt": "Count from one to twenty in words: one, two, three, four, five, six,"},
]


def require_vllm() -> None:
    try:
        environment.vllm_python()
    except UserError as exc:
        if os.environ.get(SKIP_VAR):
            pytest.skip(f"{exc} ({SKIP_VAR} is set)")
        pytest.fail(f"{exc}. These tests start a real vLLM server; set {SKIP_VAR}=1 to skip them "
                    "on a quick local run", pytrace=False)


def require_llama() -> None:
    try:
        environment.llama_server()
    except UserError as exc:
        if os.environ.get(LLAMA_SKIP_VAR):
            pytest.skip(f"{exc} ({LLAMA_SKIP_VAR} is set)")
        pytest.fail(f"{exc}. These tests start a real llama.cpp server; set {LLAMA_SKIP_VAR}=1 to skip them "
                    "on a quick local run", pytrace=False)


def llama_servers() -> list[int]:
    """Pids of llama-server processes running now (zombies waiting for a reaper do not count)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if argv and argv[0].endswith(b"llama-server") and state != "Z":
            found.append(int(entry.name))
    return found


def write_prompts(directory: Path) -> Path:
    path = directory / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


def specdec(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec_cli", *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still runs (zombies waiting for a reaper do not count)."""
    return bool(group_members(pgid))


def servers_on_port(port: int) -> list[int]:
    """Pids of vLLM API servers whose command line names this port."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in argv and b"--port" in argv:
            if argv[argv.index(b"--port") + 1] == str(port).encode():
                found.append(int(entry.name))
    return found


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("specdec: error:")]
