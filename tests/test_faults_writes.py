"""Faults on the way out: every output path goes through one writer (specdec_cli/atomic.py) that
refuses devices, FIFOs and sockets before any work, writes through a symlink to its target, and
locks a profile so that concurrent calibrations each keep their section; a stdout that cannot be
written is one line, not a traceback."""

from __future__ import annotations

import multiprocessing
import os
import stat
import subprocess
import sys
import time

import pytest
from conftest import one_line_error
from typer.testing import CliRunner

from specdec_cli import atomic
from specdec_cli.cli import app
from specdec_cli.errors import UserError
from specdec_cli.pairs import profile as profile_module
from specdec_cli.pairs.profile import PairProfile, ScenarioProfile, read_profiles, write_profile

runner = CliRunner()


def section(pair: str) -> PairProfile:
    scenario = ScenarioProfile(k=3, verdict="speculate", best_k=3, speedup=1.5, alpha=0.7, c=0.1, verify_cost={3: 1.2})
    return PairProfile(pair=pair, calibrated="2026-12-03T09:00:00+00:00", target="t", draft="d",
                       scenarios={"default": scenario})


# --- devices, FIFOs and sockets -----------------------------------------------------------------


def output_cases(prompts, path):
    return [
        (["verify-equivalence", "--prompts", prompts, "--report", path], "--report"),
        (["bench", "--prompts", prompts, "--markdown", path], "--markdown"),
        (["calibrate-k", "--prompts", prompts, "--write", "--profile", path], "--profile"),
        (["calibrate-k", "--prompts", prompts, "--plot", path], "--plot"),
    ]


def test_a_fifo_as_an_output_is_refused_before_any_work(models, tmp_path):
    """The pair does not exist: had a model been looked for first, that would be the error. A FIFO
    would hang the write at the end (nobody reads it), after the whole run."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for args, option in output_cases(str(prompts), str(fifo)):
        message = one_line_error(runner.invoke(app, args + ["--models", models, "--pair", "missing"]))
        assert message == f"{option} {fifo}: is a FIFO, not a file; give a file name", args
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root")
def test_a_device_node_as_an_output_is_refused_and_left_alone(models, tmp_path):
    """Run as root, `--report /dev/null` used to replace the machine's /dev/null with a plain file.
    The node made here is /dev/null's own (character device 1, 3), in a temporary directory."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    node = tmp_path / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    link = tmp_path / "link"
    link.symlink_to(node)
    for args, option in output_cases(str(prompts), str(node)):
        message = one_line_error(runner.invoke(app, args + ["--models", models, "--pair", "missing"]))
        assert message == f"{option} {node}: is a character device, not a file; give a file name", args
    message = one_line_error(runner.invoke(app, ["verify-equivalence", "--prompts", str(prompts), "--report", str(link),
                                                 "--models", models, "--pair", "missing"]))
    assert message == f"--report {link} (-> {node}): is a character device, not a file; give a file name"
    with pytest.raises(OSError, match="is a character device, not a regular file"):
        atomic.write_atomically(node, "x")
    assert stat.S_ISCHR(os.stat(node).st_mode) and link.is_symlink()


def test_check_writable_names_a_socket(tmp_path):
    import socket

    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(UserError, match="is a socket, not a file"):
            atomic.check_writable(path, "--report")


# --- symlinks -----------------------------------------------------------------------------------


def test_a_profile_behind_a_symlink_is_updated_and_the_link_kept(tmp_path):
    real = tmp_path / "shared" / "profile.yaml"
    real.parent.mkdir()
    write_profile(real, section("first"))
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    assert atomic.check_writable(link, "--profile") == link
    write_profile(link, section("second"))
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert sorted(read_profiles(real)) == ["first", "second"]
    assert sorted(os.listdir(tmp_path)) == ["link.yaml", "shared"]  # no temp file left beside the link


def test_a_dangling_symlink_gets_its_target_written(tmp_path):
    link = tmp_path / "report.json"
    link.symlink_to(tmp_path / "elsewhere" / "r.json")
    atomic.check_writable(link, "--report")
    atomic.write_atomically(link, "{}\n")
    assert link.is_symlink() and (tmp_path / "elsewhere" / "r.json").read_text() == "{}\n"


# --- two writers of one profile -----------------------------------------------------------------


def _slow_writer(path, pair, start):
    """One calibration's write, slowed between reading the file and replacing it: without the lock,
    every writer reads the file before any has written and the last rename wins."""
    real_write = profile_module.write_atomically

    def slow(target, text):
        time.sleep(0.3)
        real_write(target, text)

    profile_module.write_atomically = slow
    start.wait()
    write_profile(path, section(pair))


def test_concurrent_writers_of_one_profile_keep_every_section(tmp_path):
    path = tmp_path / "shared.yaml"
    write_profile(path, section("existing"))
    context = multiprocessing.get_context("fork")
    start = context.Barrier(4)
    writers = [context.Process(target=_slow_writer, args=(path, f"pair{i}", start)) for i in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=60)
    assert [w.exitcode for w in writers] == [0, 0, 0, 0]
    assert sorted(read_profiles(path)) == ["existing", "pair0", "pair1", "pair2", "pair3"]


# --- stdout -------------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [["models"], ["--help"]])
def test_a_full_disk_under_stdout_is_one_line(args, models):
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "specdec_cli", *args, *(["--models", models] if args == ["models"] else [])],
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr == "specdec: error: could not write to stdout: No space left on device\n"


def test_a_plot_is_written_through_the_one_writer(tmp_path):
    """The engine bench's curve behind a symlink: the target gets the PNG, the link stays a link."""
    from specdec_cli.commands.engine_bench import plot_curve

    level = lambda ms: {"e2el": {"p50_ms": ms}}  # noqa: E731
    result = {"plain": "vllm-plain", "modes": {"vllm-plain": {"1": level(10.0), "4": level(14.0)},
                                               "vllm-ngram:4": {"1": level(8.0), "4": level(13.0)}},
              "gain": {"vllm-ngram:4": {"1": {"gain": 1.25}, "4": {"gain": 1.08}}}}
    link = tmp_path / "curve.png"
    link.symlink_to(tmp_path / "real.png")
    plot_curve(result, link)
    assert link.is_symlink() and (tmp_path / "real.png").read_bytes().startswith(b"\x89PNG\r\n")
