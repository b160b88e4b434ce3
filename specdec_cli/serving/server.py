"""Servers specdec starts and stops itself (vLLM's, llama.cpp's), and servers it attaches to.

A server's configuration says how to start it (``command``, ``environment``) and whom it speaks
for (``engine``, ``dialect``); vLLM's is here, llama.cpp's in llama_server.py. A managed server is a
subprocess in its own process group, bound to 127.0.0.1 on a free port,
logging to a file under the cache, polled on /health until ready (with a bounded wait), and killed
with its whole group on exit, Ctrl-C, SIGTERM or failure: the context manager, an atexit hook and
the group kill together leave nothing running.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from ..errors import UserError
from . import environment
from .client import Endpoint, ServerDown, get, url_problem, without_userinfo

START_TIMEOUT_S = 300.0  # a cold start here takes ~20-25 s; a CUDA host's first compile, minutes
STOP_GRACE_S = 10.0
DIED_GRACE_S = 5.0  # how long a server that stopped answering may take to exit before it counts as alive


class ServerFailed(UserError):
    """A managed server did not come up: one line naming its log file, exit 2."""


@dataclass(frozen=True)
class ServerConfig:
    """One vLLM server: the target's directory and an optional speculative configuration (vLLM's JSON)."""

    engine = "vLLM"
    dialect = "openai"  # the completions API its client speaks (client.py)

    label: str  # the mode it serves: vllm-plain, vllm-ngram:4, ...
    model_dir: Path
    served_name: str
    speculative: dict | None = None
    dtype: str = "float32"
    max_model_len: int = 2048
    threads: int | None = None
    port: int | None = None  # None: a free one
    extra_args: tuple[str, ...] = ()

    def arguments(self, port: int) -> list[str]:
        args = ["-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model_dir),
                "--served-model-name", self.served_name, "--host", "127.0.0.1", "--port", str(port),
                "--dtype", self.dtype, "--max-model-len", str(self.max_model_len), "--enforce-eager",
                "--disable-uvicorn-access-log", "--max-logprobs", "20"]
        if self.speculative:
            args += ["--speculative-config", json.dumps(self.speculative, separators=(",", ":"))]
        return args + list(self.extra_args)

    def command(self, port: int) -> list[str]:
        return [str(environment.vllm_python()), *self.arguments(port)]

    def environment(self) -> dict[str, str]:
        return environment.server_environment(self.threads)


def speculative_config(method: str, k: int, draft_dir: Path | None = None) -> dict | None:
    """vLLM's --speculative-config for a mode: prompt lookup as its ``ngram``, a draft model as is."""
    if method == "plain":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    if method in ("draft_model", "eagle3"):
        return {"method": method, "model": str(draft_dir), "num_speculative_tokens": k}
    raise ValueError(method)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def mode_port(port: int | None, index: int) -> int | None:
    """The port of a bench's ``index``-th server: the --port given is the first's and the next ones count
    up from it; None (no --port): each gets a free one."""
    return None if port is None else port + index


def check_port(port: int, label: str) -> None:
    """A port the user chose that something already listens on: said now, in one line, rather than
    after the engine has spent its start-up (tens of seconds for vLLM) finding out. The probe binds as the
    engines do (SO_REUSEADDR), so a port a closed connection lingers on is not taken for a busy one;
    a port taken between this probe and the engine's bind is still told from its log (``_reason``)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise UserError(f"the server for {label} cannot start: port {port} of 127.0.0.1 is in use "
                            f"({exc.strerror or exc}); give another --port, or none for a free one") from None


def log_directory() -> Path:
    from ..pairs.cache_dir import cache_root

    return cache_root() / "vllm-logs"  # every managed server's, llama.cpp's too: `watch` finds them here


def running_servers() -> list[dict]:
    """The managed servers alive now, newest first: what `specdec watch` without a URL looks at."""
    found = []
    for path in sorted(log_directory().glob("*.running.json"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            entry = json.loads(path.read_text())
            os.kill(entry["pid"], 0)
        except (OSError, ValueError, KeyError):
            path.unlink(missing_ok=True)  # its owner is gone
            continue
        found.append(entry)
    return found


_RUNNING: set["ManagedServer"] = set()


def _stop_all() -> None:
    for server in list(_RUNNING):
        server.stop()


def _stop_all_on_exit() -> None:
    """Registered as a server starts, not when this module is imported; once, however many start."""
    atexit.unregister(_stop_all)
    atexit.register(_stop_all)


def _terminate_on_sigterm() -> None:
    """A SIGTERM to specdec runs the exit path (and so the servers' stop) instead of dying at once."""
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    except ValueError:  # not the main thread
        pass


@dataclass(eq=False)
class ManagedServer:
    config: ServerConfig
    start_timeout_s: float = START_TIMEOUT_S
    progress: Callable[[str], None] = lambda line: None
    process: subprocess.Popen | None = field(default=None, init=False)
    endpoint: Endpoint | None = field(default=None, init=False)
    log_path: Path | None = field(default=None, init=False)
    started_s: float | None = field(default=None, init=False)  # seconds from launch to ready
    _stopped: bool = field(default=False, init=False)

    def __enter__(self) -> "ManagedServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> Endpoint:
        if self.config.port:
            check_port(self.config.port, self.config.label)
        port = self.config.port or free_port()
        command = self.config.command(port)  # a missing engine is said before a log is opened
        directory = log_directory()
        directory.mkdir(parents=True, exist_ok=True)
        safe = "".join(c if c.isalnum() or c in "-." else "-" for c in self.config.label)
        self.log_path = directory / f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}-{port}.log"
        _terminate_on_sigterm()
        _stop_all_on_exit()
        begun = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=str(directory),
                                            env=self.config.environment(), start_new_session=True)
        _RUNNING.add(self)
        self.endpoint = Endpoint(f"http://127.0.0.1:{port}", model=self.config.served_name, dialect=self.config.dialect)
        try:
            self._wait_ready(begun)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - begun
        self._marker().write_text(json.dumps({"url": self.endpoint.url, "mode": self.config.label,
                                              "pid": self.process.pid, "log": str(self.log_path)}))
        return self.endpoint

    def _marker(self) -> Path:
        return self.log_path.with_suffix(".running.json")

    def _wait_ready(self, begun: float) -> None:
        last_shown = -10.0
        while True:
            waited = time.monotonic() - begun
            code = self.process.poll()
            if code is not None:
                raise ServerFailed(f"the {self.config.engine} server for {self.config.label} exited with code {code} before it was ready"
                                   f"{_reason(self.log_path)}; its log: {self.log_path}")
            if waited > self.start_timeout_s:
                raise ServerFailed(f"the {self.config.engine} server for {self.config.label} was not ready after {self.start_timeout_s:.0f} s; "
                                   f"its log: {self.log_path}")
            try:
                get(self.endpoint, "/health", timeout=2.0)
                return
            except ServerDown:
                pass
            if waited - last_shown >= 5.0:
                self.progress(f"starting {self.config.engine} for {self.config.label} on port {self.endpoint.port}: {waited:.0f} s")
                last_shown = waited
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.process is not None and not self._stopped and self.process.poll() is None

    def died(self) -> str | None:
        """Why the server is gone (its exit code and log), or None while it runs. Asked once it stopped
        answering: a killed server of a few GB takes a moment to exit, so it is waited for (bounded)."""
        if self.process is None:
            return None
        try:
            self.process.wait(DIED_GRACE_S)
        except subprocess.TimeoutExpired:
            return None
        return f"the {self.config.engine} server for {self.config.label} died (exit code {self.process.returncode}); its log: {self.log_path}"

    def stop(self) -> None:
        """SIGTERM to the whole group (the API server, its engine core and workers), SIGKILL after a
        grace for whatever outlived it. Safe to call twice."""
        _RUNNING.discard(self)
        process = self.process
        if process is None or self._stopped:
            return
        self._stopped = True
        if self.log_path:
            self._marker().unlink(missing_ok=True)
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(process.pid, signal.SIGKILL)  # workers that outlived their parent too
        process.wait()
        deadline = time.monotonic() + STOP_GRACE_S
        while group_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc: what a stop must leave empty."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:  # state, ppid, pgrp
            members.append(int(entry.name))
    return members


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reason(log: Path) -> str:
    """The clue in a failed server's log: a busy port, a bad model directory, else its last error line."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    text = "\n".join(lines)
    if "Address already in use" in text or "address already in use" in text or "couldn't bind HTTP server socket" in text:
        return " (its port is in use)"
    errors = [line.strip() for line in lines if "Error" in line or "error:" in line]
    return f" ({errors[-1][:200]})" if errors else ""


def attach(url: str, option: str = "--server", api_key_var: str = "SPECDEC_API_KEY") -> Endpoint:
    """An already running OpenAI-compatible server, given as ``option`` (how messages name it); its API
    key, if any, comes from the environment. A user:password in the URL goes as Basic auth, never printed."""
    url, userinfo = without_userinfo(url)
    if not url.startswith(("http://", "https://")):
        shown = url.rpartition("@")[2]  # no scheme, so no userinfo found: whatever precedes an @ may be a password
        raise UserError(f"{option} {shown!r}: give a URL such as http://127.0.0.1:8000")
    problem = url_problem(url)
    if problem:
        raise UserError(f"{url}: not a URL ({problem}); give one such as http://127.0.0.1:8000")
    endpoint = Endpoint(url.rstrip("/").removesuffix("/v1"), api_key=os.environ.get(api_key_var) or None, userinfo=userinfo)
    try:
        names = endpoint.models()
    except ServerDown as exc:
        raise UserError(f"no server answers at {endpoint.url}: {exc}") from None
    if not names:
        raise UserError(f"the server at {endpoint.url} serves no model")
    return replace(endpoint, model=names[0], dialect=dialect_of(endpoint))


def dialect_of(endpoint: Endpoint) -> str:
    """llama.cpp's server answers /props with its build (and is then asked in its own API: token ids
    and the prompt cache are only there); any other server is spoken to in OpenAI's."""
    try:
        props = json.loads(get(endpoint, "/props", timeout=5.0))
    except (ServerDown, ValueError):
        return "openai"
    return "llama.cpp" if isinstance(props, dict) and "build_info" in props else "openai"
