"""What a person sees at the edges: usage errors, broken pipes, output paths checked before the work,
files that fail to write at the end, incomplete model directories, YAML errors, help, the live view."""

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import char_tokenizer, one_line_error
from rich.console import Console
from typer.testing import CliRunner

import specdec_cli
from specdec_cli.cli import app
from specdec_cli.commands import calibrate as calibrate_module
from specdec_cli.commands import verify as verify_module
from specdec_cli.decoding.engine import RoundEvent

runner = CliRunner()
ROOT = Path(specdec_cli.__file__).parents[1]  # this very copy of specdec_cli


# --- usage errors and broken pipes --------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["generate", "--no-such-option"], "No such option: --no-such-option"),
    (["generate", "--max-new-tokens", "abc", "x"], "Invalid value for '--max-new-tokens'"),
    (["verify-equivalence"], "Missing option '--prompts'"),
    (["no-such-command"], "No such command 'no-such-command'"),
])
def test_typer_usage_errors_are_one_line_and_exit_2(args, message):
    assert message in one_line_error(runner.invoke(app, args))


@pytest.mark.parametrize("command", ["generate --json --max-new-tokens 2", "models --json"])
def test_a_reader_that_closes_the_pipe_ends_the_command_with_exit_0(models, command):
    prompts = "\n".join(f"prompt {i}" for i in range(60)) + "\n"
    shell = f"set -o pipefail; {sys.executable} -m specdec_cli {command} --models {models} | head -c 10"
    done = subprocess.run(["bash", "-c", shell], input=prompts, capture_output=True, text=True, check=False, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout) == 10 and done.stderr == ""


# --- output paths -------------------------------------------------------------------------------


def test_output_paths_are_checked_before_any_model_loads(models, tmp_path):
    """The `missing` pair's target does not exist: had the model been looked for first, that would be the error."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    a_file = tmp_path / "file"
    a_file.write_text("")
    base = ["--models", models, "--pair", "missing"]
    cases = [
        (["verify-equivalence", "--prompts", str(prompts), "--report", str(tmp_path)], f"--report {tmp_path}: is a directory; give a file name"),
        (["verify-equivalence", "--prompts", str(prompts), "--report", "/proc/r.json"], "--report /proc/r.json: cannot write in /proc"),
        (["verify-equivalence", "--prompts", str(prompts), "--report", str(a_file / "r.json")], f"--report {a_file / 'r.json'}: {a_file} is not a directory"),
        (["bench", "--prompts", str(prompts), "--markdown", str(tmp_path)], f"--markdown {tmp_path}: is a directory"),
        (["bench", "--prompts", str(prompts), "--markdown", "/proc/b.md"], "--markdown /proc/b.md: cannot write in /proc"),
        (["calibrate-k", "--prompts", str(prompts), "--write", "--profile", str(tmp_path)], f"--profile {tmp_path}: is a directory"),
        (["calibrate-k", "--prompts", str(prompts), "--write", "--profile", "/proc/p.yaml"], "--profile /proc/p.yaml: cannot write in /proc"),
        (["calibrate-k", "--prompts", str(prompts), "--plot", str(tmp_path)], f"--plot {tmp_path}: is a directory"),
        (["train-draft", "--prompts", str(prompts), "--kind", "head", "--steps", "1", "--out", str(a_file)], f"--out {a_file}: exists and is not a directory"),
        (["train-draft", "--prompts", str(prompts), "--kind", "head", "--steps", "1", "--out", "/proc/d"], "--out /proc/d: cannot write in /proc"),
    ]
    for args, message in cases:
        assert one_line_error(runner.invoke(app, args + base)).startswith(message), args


def test_missing_directories_are_created_for_every_output(models, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("abcabc\n")
    report = tmp_path / "new" / "dir" / "r.json"
    result = runner.invoke(app, ["verify-equivalence", "--models", models, "--prompts", str(prompts), "-k", "2",
                                 "--max-new-tokens", "4", "--report", str(report)])
    assert result.exit_code == 0, result.output
    assert json.loads(report.read_text())["equivalent"] is True


def test_a_report_that_cannot_be_written_at_the_end_leaves_the_result_on_stdout(models, tmp_path, monkeypatch):
    def refuse(path, text):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(verify_module, "write_atomically", refuse)
    prompts = tmp_path / "p.txt"
    prompts.write_text("abcabc\n")
    report = tmp_path / "r.json"
    result = runner.invoke(app, ["verify-equivalence", "--models", models, "--prompts", str(prompts), "-k", "2",
                                 "--max-new-tokens", "4", "--json", "--report", str(report)])
    assert one_line_error(result, code=3) == f"could not write --report {report}: Permission denied (the result is on stdout)"
    assert json.loads(result.stdout)["equivalent"] is True


def test_a_profile_that_cannot_be_written_at_the_end_leaves_the_tables_on_stdout(models, tmp_path, monkeypatch):
    def refuse(path, profile):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(calibrate_module, "write_profile", refuse)
    prompts = tmp_path / "p.txt"
    prompts.write_text("abcabc\n")
    profile = tmp_path / "profile.yaml"
    result = runner.invoke(app, ["calibrate-k", "--models", models, "--prompts", str(prompts), "--k", "0,2",
                                 "--max-new-tokens", "4", "--write", "--profile", str(profile)])
    assert result.exit_code == 3, result.output
    assert f"specdec: error: could not write --profile {profile}: No space left on device" in result.stderr
    assert "best K" in result.stdout and not profile.exists()


# --- model directories and YAML -----------------------------------------------------------------


@pytest.mark.parametrize("option", ["--target", "--draft"])
def test_an_empty_model_directory_names_the_missing_files(models, tmp_path, option):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(app, ["generate", "--models", models, option, str(empty), "--max-new-tokens", "2", "hello"])
    assert one_line_error(result) == (
        f"{empty} is not a model directory: missing config.json, weights (model.safetensors or pytorch_model.bin), "
        "a tokenizer (tokenizer.json or tokenizer.model)")


def test_a_model_directory_without_a_tokenizer_says_just_that(pair_dir, tmp_path):
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("config.json", "model.safetensors"):
        (partial / name).write_bytes((pair_dir / "target" / name).read_bytes())
    result = runner.invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--target", str(partial), "x"])
    assert one_line_error(result).endswith("missing a tokenizer (tokenizer.json or tokenizer.model)")


def test_a_yaml_error_in_models_yaml_names_file_line_and_column(tmp_path):
    bad = tmp_path / "models.yaml"
    bad.write_text("pairs:\n  a:\n    target: x\n   k: 3\n")
    message = one_line_error(runner.invoke(app, ["models", "--models", str(bad)]))
    assert message.startswith(f"{bad}, line 4, column 4: not valid YAML (")


def test_a_yaml_error_in_a_profile_names_file_line_and_column(models, tmp_path):
    bad = tmp_path / "profile.yaml"
    bad.write_text("pairs:\n  tiny: [1, 2\n")
    result = runner.invoke(app, ["generate", "--models", models, "--profile", str(bad), "-k", "auto", "x"])
    assert one_line_error(result).startswith(f"{bad}, line 3, column 1: not valid YAML (")


# --- option checks before torch, help -----------------------------------------------------------

LIGHT = r"""
import sys, time
from typer.testing import CliRunner
from specdec_cli.cli import app

for args in (["generate", "-k", "abc", "x"], ["generate", "--max-new-tokens", "0", "x"], ["generate", "--top-p", "2", "x"],
             ["generate", "--threads", "0", "x"], ["verify-equivalence", "--prompts", "p", "--report", "/proc/r.json"]):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and result.stderr.startswith("specdec: error:"), (args, result.output)
    heavy = [name for name in ("torch", "transformers") if name in sys.modules]
    assert not heavy, f"specdec {' '.join(args)} imported {heavy}"
"""


def test_option_errors_answer_before_torch_is_imported():
    done = subprocess.run([sys.executable, "-c", LIGHT], capture_output=True, text=True, check=False, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr


def help_text(*command: str) -> str:
    """In a process of its own: CliRunner pins help to 80 columns."""
    done = subprocess.run([sys.executable, "-m", "specdec_cli", *command, "--help"], capture_output=True, text=True,
                          check=False, timeout=60, cwd=ROOT, env=os.environ | {"COLUMNS": "100"})
    assert done.returncode == 0, done.stderr
    return done.stdout


COMMANDS = ["generate", "models", "verify-equivalence", "bench", "calibrate-k", "train-draft"]


def test_help_reads_well():
    for command in COMMANDS:
        text = help_text(command)
        assert "<bool>" not in text and "<str>" not in text, command
        assert max(map(len, text.splitlines())) <= 100, command
        if command != "models":
            assert "--prompts FILE" in text or command == "generate", command
            assert "--threads N" in text and "--max-new-tokens N" in text, command
    train = help_text("train-draft")
    assert len(train.splitlines()) < 60
    layers = next(line for line in train.splitlines() if "--layers" in line)
    assert "default: 0" not in layers


def test_a_table_to_a_pipe_keeps_each_value_whole_and_has_no_trailing_blanks(models, pair_dir):
    result = runner.invoke(app, ["models", "--models", models], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "model: " + str(pair_dir.resolve() / "draft") in result.stdout
    assert all(line == line.rstrip() for line in result.stdout.splitlines())


# --- threads ------------------------------------------------------------------------------------

# The OpenMP and MKL settings as they stand when torch starts to load, and how often the machine was looked at.
THREADS_PROBE = r"""
import atexit, json, os, sys

at_torch = {}


class Watch:  # an import hook: sees the first import of torch before it runs
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not at_torch:
            at_torch.update({k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MKL_CBWR")})


sys.meta_path.insert(0, Watch())
from specdec_cli.runtime import threads

looks, real = [], threads.busy_cores
threads.busy_cores = lambda *args: looks.append(1) or real(*args)
atexit.register(lambda: print("PROBE", json.dumps({"looks": len(looks), "at_torch": at_torch or None, "omp": [
    os.environ.get("OMP_WAIT_POLICY"), os.environ.get("OMP_NUM_THREADS")]}), file=sys.stderr, flush=True))
sys.argv = ["specdec", *sys.argv[1:]]
from specdec_cli.cli import main  # the entry point itself: it opens a computing command's look

main()
"""


def threads_probe(args: list[str], env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", THREADS_PROBE, *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)
    line = next(line for line in done.stderr.splitlines() if line.startswith("PROBE "))
    return json.loads(line.removeprefix("PROBE "))


def unset_threads_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "MKL_CBWR")}


def test_thread_settings_leave_an_idle_machine_to_openmp_and_gives_a_busy_one_its_free_cores():
    from specdec_cli.runtime.threads import thread_settings

    assert thread_settings(2, 0.1) == {}
    assert thread_settings(2, 1.0) == {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    assert thread_settings(2, 2.0) == {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}  # never fewer than one
    assert thread_settings(8, 2.6) == {"OMP_NUM_THREADS": "5", "OMP_WAIT_POLICY": "PASSIVE"}


def test_the_look_counts_other_processes_busy_time_without_this_ones(monkeypatch):
    """Over 0.1 s of 20 ticks on 2 cores: 15 busy, 5 of them this process's own (its option parsing)."""
    from specdec_cli.runtime.threads import others_busy

    real = os.sysconf
    monkeypatch.setattr(os, "sysconf", lambda name: 100 if name == "SC_CLK_TCK" else real(name))
    assert others_busy((0.0, 1000, 500, 1.0), (0.1, 1020, 505, 1.05), cores=2) == pytest.approx(1.0)
    assert others_busy((0.0, 1000, 500, 1.0), (0.1, 1020, 505, 1.2), cores=2) == 0.0  # never below none
    assert others_busy((0.0, 1000, 500, 1.0), (0.1, 1000, 500, 1.0), cores=2) == 0.0  # no tick passed


@pytest.mark.parametrize("args", [["--help"], ["generate", "--help"], ["models", "--json"], ["generate", "-k", "99", "x"]],
                         ids=["help", "command-help", "models", "usage-error"])
def test_help_and_commands_that_compute_nothing_never_look_at_the_machine(models, args):
    """The look costs a tenth of a second: `specdec --help` and `specdec models` do not pay it."""
    probe = threads_probe([*args, *(["--models", models] if args[0] == "models" else [])], unset_threads_env())
    assert probe == {"looks": 0, "at_torch": None, "omp": [None, None]}


def test_a_computing_command_looks_once_and_sets_threads_before_torch_loads_and_keeps_the_users_own_choice(models):
    generate = ["generate", "--models", models, "--pair", "tiny-ngram", "-k", "0", "--max-new-tokens", "1", "--json", "abc"]
    # at the lowest priority: /proc/stat counts it busy, yet it takes no core from the test run's other work
    busy = subprocess.Popen([sys.executable, "-c", "import os\nos.nice(19)\nwhile True: pass"])
    try:
        time.sleep(0.5)
        chosen = threads_probe(generate, unset_threads_env())
        kept = threads_probe(generate, unset_threads_env() | {"OMP_WAIT_POLICY": "ACTIVE", "MKL_CBWR": "COMPATIBLE"})
    finally:
        busy.kill()
    cores = os.cpu_count() or 1
    assert chosen["looks"] == 1
    if cores > 1:
        assert chosen["at_torch"] == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": str(cores - 1), "MKL_CBWR": "AVX2"}
    assert kept == {"looks": 0, "at_torch": {"OMP_WAIT_POLICY": "ACTIVE", "OMP_NUM_THREADS": None, "MKL_CBWR": "COMPATIBLE"},
                    "omp": ["ACTIVE", None]}


@pytest.mark.parametrize("torch_first", [False, True])
def test_the_machine_is_looked_at_once_a_process_and_not_at_all_once_torch_is_loaded(monkeypatch, torch_first):
    from specdec_cli.runtime import threads

    looks = []
    monkeypatch.setattr(threads, "busy_cores", lambda *args: looks.append(1) or 1.0)
    monkeypatch.setattr(threads, "_chosen", False)
    monkeypatch.setattr(threads, "_chosen_by", "user")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OMP_")}
    monkeypatch.setattr(os, "environ", environ)  # a copy: the test process keeps its own
    if not torch_first:
        monkeypatch.delitem(sys.modules, "torch")  # as in a command that has not imported it yet
    threads.apply(None)
    threads.apply(None)
    assert len(looks) == (0 if torch_first else 1)
    assert environ.get("OMP_WAIT_POLICY") == (None if torch_first else "PASSIVE")
    assert threads._chosen_by.startswith("nobody") == torch_first


def test_threads_option_sets_torch_threads_and_the_bench_manifest_records_the_policy(models, tmp_path):
    import torch

    before = torch.get_num_threads()
    prompts = tmp_path / "p.txt"
    prompts.write_text("abcabc\n")
    try:
        result = runner.invoke(app, ["bench", "--models", models, "--prompts", str(prompts), "--modes", "plain",
                                     "--max-new-tokens", "2", "--json", "--threads", "1"])
        assert result.exit_code == 0, result.output
        threads = json.loads(result.stdout)["manifest"]["threads"]
        assert threads["torch_threads"] == 1 and threads["threads_from"] == "--threads"
        assert threads["omp_wait_policy"] == os.environ.get("OMP_WAIT_POLICY", "unset (OpenMP's default)")
    finally:
        torch.set_num_threads(before)


# --- the live view ------------------------------------------------------------------------------


def event(drafted, accepted, token, emitted):
    return RoundEvent(k=len(drafted), drafted=drafted, accepted=accepted, token=token, emitted=emitted,
                      draft_s=0.001, verify_s=0.001, finished=False)


def test_the_finished_answer_holds_no_rejected_draft_and_the_status_fits_the_width():
    from specdec_cli.commands.live import LiveView
    from specdec_cli.measure.run_stats import RunStats

    tokenizer = char_tokenizer()
    ids = lambda text: tokenizer.encode(text, add_special_tokens=False)
    console = Console(file=io.StringIO(), force_terminal=True, width=40, height=20)
    stats = RunStats(3)
    view = LiveView(console, tokenizer, "tiny")
    with view:
        for e in (event(ids("ab"), 2, ids("c")[0], ids("abc")), event(ids("xy\n"), 0, ids("d")[0], ids("d"))):
            stats.add(e)
            view.update(e, stats)
        stats.finish()
        status = view._render().renderables[1]
        assert status.plain.endswith("…") and len(status.plain) <= 39
    assert view.clean.plain == "abcd"  # the rejected "xy\n" was shown while running, and only then
    assert "xy" in view.text.plain
    view.show_summary()
    assert "3 rejected" in console.file.getvalue()


def test_fit_cuts_a_line_to_the_width():
    from rich.text import Text

    from specdec_cli.commands.live import fit

    assert fit(Text("x" * 50), 20).plain == "x" * 18 + "…"


def test_a_profile_for_other_models_is_one_warning_line_that_says_what_differs(models, pair_dir, tmp_path):
    from specdec_cli.pairs.profile import PairProfile, ScenarioProfile, write_profile

    section = ScenarioProfile(k=2, verdict="speculate", best_k=2, speedup=1.5, alpha=0.8, c=0.1, verify_cost={2: 1.2})
    profile = tmp_path / "profile.yaml"
    write_profile(profile, PairProfile(pair="tiny", calibrated="2026-01-01T00:00:00", target="/elsewhere/target",
                                       draft=str(pair_dir / "draft"), scenarios={"default": section}))
    result = runner.invoke(app, ["generate", "--models", models, "--profile", str(profile), "-k", "auto", "--json",
                                 "--max-new-tokens", "2", "x"], env={"COLUMNS": "60"})
    assert result.exit_code == 0, result.output
    assert result.stderr == (f"specdec: warning: {profile}: ignoring the profile of 'tiny': calibrated with other models: "
                             f"target '/elsewhere/target' then, '{pair_dir / 'target'}' now\n")


def test_the_cores_notices_are_rendered_by_the_command_line_one_line_each(pair_dir, models, cache):
    """pairs/ and decoding/ print nothing themselves (notices.py): a damaged prepared file, told by
    the loader, reaches the user as the command line's own warning line."""
    args = ["generate", "--models", models, "--pair", "tiny-ngram", "--dtype", "int8", "--json", "--max-new-tokens", "2", "hi"]
    assert runner.invoke(app, args).exit_code == 0
    (path,) = cache.glob("prepared-*.pt")
    path.write_bytes(path.read_bytes()[:100])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert [line for line in lines if "prepared target" in line] == [
        line for line in lines if line.startswith("specdec: warning: the prepared target is unusable (")]
    assert sum("prepared target" in line for line in lines) == 1
    assert runner.invoke(app, args).stderr.count("prepared target") == 0  # made again, used silently
