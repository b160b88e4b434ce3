"""Input read within bounds (issue 65's cases 3, 7 and 10): a models.yaml or profile whose aliases
expand like the "billion laughs", nesting 200,000 levels deep, a runaway file, a damaged store and a
damaged kept store table are each one line and exit 2 (or, for the cache's table, one warning and the
same tokens), never a traceback, gigabytes of memory or a gigabyte-long message."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import one_line_error
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.errors import UserError

runner = CliRunner()

PAIR = "pairs:\n  p:\n    target: {source: ./t, device_map: {model: 0}}\n    draft: ngram\n"


def bomb(under: str = "      ") -> str:
    """Nine levels of nine references to one scalar, as in the issue's 656-byte models.yaml (this one
    is 655): 387 million nodes once written out."""
    levels = [f"{under}a0: &a0 lol"]
    levels += [f"{under}a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join(levels) + "\n"


MODELS_BOMB = "pairs:\n  p:\n    target:\n      source: ./t\n      device_map:\n" + bomb("        ") + "    draft: ngram\n"
PROFILE_BOMB = "pairs:\n  p:\n    target: ./t\n    settings:\n" + bomb() + "    scenarios: {}\n"
GROWTH = "its aliases add 1,797,873,192 nodes and characters when written out, more than 100,000; " \
         "write shared values out, or share fewer"

# A child python, its address space capped, so that a loader that expands the bomb again fails at
# once instead of taking the machine; at exit it writes its peak resident memory to argv[1] (VmHWM,
# in kB: its own, where getrusage's ru_maxrss keeps the forking pytest's).
BOUNDED = """
import atexit, re, resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
peak = Path(sys.argv[1])
atexit.register(lambda: peak.write_text(re.search(r"VmHWM:\\s*(\\d+)", Path("/proc/self/status").read_text())[1]))
{body}
"""
CLI = "sys.argv = ['specdec', *sys.argv[2:]]\nfrom specdec_cli.cli import main\nmain()"
PROFILE = """from specdec_cli.errors import UserError
from specdec_cli.pairs.profile import read_profiles
try:
    read_profiles(Path(sys.argv[2]))
except UserError as exc:
    print(f"specdec: error: {exc}", file=sys.stderr)
    sys.exit(2)"""


def bounded(tmp_path: Path, body: str, *args: str) -> tuple[subprocess.CompletedProcess, int]:
    """(the finished child, its peak memory in MiB): ``body`` run in a capped python with ``args``."""
    peak = tmp_path / "peak"
    done = subprocess.run([sys.executable, "-c", BOUNDED.format(body=body), str(peak), *args],
                          capture_output=True, text=True, timeout=30)
    return done, int(peak.read_text()) // 1024


@pytest.mark.parametrize("body, text", [(CLI, MODELS_BOMB), (PROFILE, PROFILE_BOMB)], ids=["models", "profile"])
def test_a_billion_laughs_is_refused_at_once_in_little_memory(tmp_path, body, text):
    """The issue's models.yaml took 18.5 GB and 80 s and printed a 2.1 GB line; the profile did the same."""
    path = tmp_path / "file.yaml"
    path.write_text(text)
    assert len(MODELS_BOMB.encode()) < 700
    args = ["models", "--models", str(path)] if body == CLI else [str(path)]
    done, peak_mib = bounded(tmp_path, body, *args)
    assert (done.returncode, done.stderr.splitlines()) == (2, [f"specdec: error: {path}: {GROWTH}"])
    assert peak_mib < 100, peak_mib


def models_error(tmp_path: Path, text: str) -> tuple[Path, str]:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path, one_line_error(runner.invoke(app, ["models", "--models", str(path)]))


def test_settings_shared_by_anchors_still_read(tmp_path):
    from specdec_cli.pairs.registry import load_registry

    path = tmp_path / "models.yaml"
    path.write_text("pairs:\n  p:\n    target: {source: ./t, device_map: &map {model: 0, lm_head: cpu}}\n    draft: ngram\n"
                    "  q:\n    target: {source: ./u, device_map: *map}\n    draft: ngram\n")
    registry = load_registry(path)
    assert registry.pair("p").target.device_map == registry.pair("q").target.device_map == {"model": 0, "lm_head": "cpu"}


def test_an_alias_inside_its_own_anchor_is_one_line(tmp_path):
    path, message = models_error(tmp_path, "pairs:\n  p:\n    target: {source: ./t, device_map: &m {model: *m}}\n    draft: ngram\n")
    assert message == f"{path}: an alias refers to a node that contains it; write the value out instead"


def test_200000_levels_of_nesting_in_models_yaml_are_one_line(tmp_path):
    path, message = models_error(tmp_path, "pairs: " + "[" * 200_000 + "\n")
    assert message == f"{path}: nested too deeply to be a specdec file"


def test_a_runaway_models_yaml_is_refused_unread(tmp_path):
    from specdec_cli.pairs.yaml_input import MAX_YAML_BYTES

    path, message = models_error(tmp_path, PAIR + "#" * MAX_YAML_BYTES + "\n")
    assert message == f"{path}: {MAX_YAML_BYTES + len(PAIR) + 1:,} bytes; specdec's YAML files are at most {MAX_YAML_BYTES:,}"


def test_a_long_value_in_a_message_is_cut_short(tmp_path):
    """A message shows a wrong value as reprlib does: enough to find it, never the whole of it."""
    path, message = models_error(tmp_path, PAIR.replace("{model: 0}", json.dumps(list(range(10_000)))))
    assert message == (f"{path}: pair 'p' target: 'device_map' must be a device or a mapping of modules to devices, "
                       "got [0, 1, 2, 3, 4, 5, ...]")
    path, message = models_error(tmp_path, PAIR + f"    description: [{'x' * 100_000}]\n")
    assert message == f"{path}: pair 'p': 'description' must be a string, got ['{'x' * 97}...{'x' * 98}']"


def test_models_naming_a_directory_says_so(tmp_path, monkeypatch):
    message = one_line_error(runner.invoke(app, ["models", "--models", str(tmp_path)]))
    assert message == f"models file {tmp_path} is a directory; name the YAML file (models.yaml) itself"
    monkeypatch.setenv("SPECDEC_MODELS", str(tmp_path))
    assert one_line_error(runner.invoke(app, ["models"])) == message


def test_profile_naming_a_directory_says_so(tmp_path):
    from specdec_cli.pairs.profile import open_profile
    from specdec_cli.pairs.registry import load_registry

    (tmp_path / "models.yaml").write_text(PAIR)
    with pytest.raises(UserError) as error:
        open_profile(tmp_path, load_registry(tmp_path / "models.yaml").pair("p"))
    assert str(error.value) == f"profile file {tmp_path} is a directory; name the profile (a YAML file) itself"


# --- a store's answers file and its kept table ------------------------------------------------------


def store_pair(tmp_path: Path, pair_dir: Path) -> Path:
    models = tmp_path / "models.yaml"
    models.write_text(f"pairs:\n  p:\n    target: {pair_dir / 'target'}\n    draft: ngram\n"
                      "    drafters: {store: answers.jsonl.gz}\n")
    return models


def generate(models: Path, *args: str):
    return runner.invoke(app, ["generate", "--models", str(models), "--raw", "--json", "--max-new-tokens", "24",
                               *args, "the cat sat on"])


def damaged_gzip(text: bytes) -> bytes:
    data = bytearray(gzip.compress(text, mtime=0))
    data[20] ^= 0xFF  # inside the deflate stream: zlib's error, not gzip's
    return bytes(data)


@pytest.mark.parametrize("data, problem", [
    (damaged_gzip("".join(json.dumps({"ids": list(range(i, i + 50))}) + "\n" for i in range(40)).encode()),
     ": damaged (zlib: Error -3 while decompressing data: "),
    (gzip.compress(b'{"ids": ' + b"[" * 200_000 + b"\n"), ", line 1: not JSON (nested too deeply)"),
], ids=["damaged-gzip", "deep-line"])
def test_a_damaged_or_too_deep_store_is_one_line(pair_dir, tmp_path, cache, data, problem):
    models = store_pair(tmp_path, pair_dir)
    answers = tmp_path / "answers.jsonl.gz"
    answers.write_bytes(data)
    message = one_line_error(generate(models, "--drafter", "store", "-k", "3"))
    assert message.startswith(f"store {answers}{problem}"), message


def test_a_kept_table_with_successors_outside_the_vocabulary_is_built_again(pair_dir, tmp_path, cache):
    """The cache checked only that the parts of a kept table map: a successor past the vocabulary was
    drafted and ended generate in an IndexError. Now the table is built again, with one warning."""
    models = store_pair(tmp_path, pair_dir)
    plain = json.loads(generate(models, "-k", "0").stdout)["token_ids"]
    (tmp_path / "answers.jsonl.gz").write_bytes(gzip.compress(json.dumps({"ids": plain}).encode()))
    assert json.loads(generate(models, "--drafter", "store", "-k", "3").stdout)["token_ids"] == plain
    [entry] = (cache / "stores").iterdir()
    successors = np.load(entry / "successors.npy")
    np.save(entry / "successors.npy", successors + 1000)

    result = generate(models, "--drafter", "store", "-k", "3")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["token_ids"] == plain
    warning = f"the store's kept table {entry} is damaged (successors outside the target's vocabulary (0 to 97)); building it again"
    assert warning in " ".join(result.stderr.split())
    assert np.array_equal(np.load(entry / "successors.npy"), successors)


def test_a_store_that_inflates_past_its_bound_is_refused_in_bounded_memory(pair_dir, tmp_path, cache, monkeypatch):
    """A small gzip may stand for gigabytes: it is inflated in bounded steps and refused at the bound."""
    from specdec_cli.decoding.drafters import store_file

    monkeypatch.setattr(store_file, "MAX_ANSWERS_BYTES", 100_000)
    models = store_pair(tmp_path, pair_dir)
    answers = tmp_path / "answers.jsonl.gz"
    answers.write_bytes(gzip.compress(b" " * 1_000_000))  # 1 MB of blanks in ~1 kB
    message = one_line_error(generate(models, "--drafter", "store", "-k", "3"))
    assert message == f"store {answers}: inflates past 100,000 bytes; a store holds at most that"
    line = json.dumps({"ids": list(range(5, 60))}).encode() + b"\n"
    answers.write_bytes(gzip.compress(line) + gzip.compress(line))  # two members, within the bound: read whole
    assert generate(models, "--drafter", "store", "-k", "3").exit_code == 0
