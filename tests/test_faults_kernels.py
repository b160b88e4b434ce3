"""Damaged cache files specdec owns: its kernel library (checked against the size and sha256 recorded
when it was built, and built again, never handed to dlopen damaged) and its block-cost files (anything
but what it wrote is measured again). Either way: one warning, and the output does not change."""

import hashlib
import json
import logging
import subprocess
import sys

import pytest
import torch

from specdec_cli.decoding import blocks
from specdec_cli.pairs.cache_dir import cache_root
from specdec_cli.runtime import native_kernels

BUILD = native_kernels.build  # the compiler's call, where a test fakes it
GOOD = b"specdec kernels " * 1000  # a stand-in library where the build is faked: 16,000 bytes


def record_of(data: bytes, diagnostics: str = "") -> dict:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "diagnostics": diagnostics}


def built(library, data: bytes) -> None:
    """``library`` as a successful build leaves it: the file, then its record beside it."""
    library.parent.mkdir(parents=True, exist_ok=True)
    library.write_bytes(data)
    library.with_suffix(".sha256").write_text(json.dumps(record_of(data)))


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.fixture
def library(tmp_path, monkeypatch):
    """The library's path in a kernel directory and cache of the test's own."""
    monkeypatch.setenv("SPECDEC_KERNELS", str(tmp_path / "kernels"))
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(native_kernels, "_told", [])
    return native_kernels.library_path(tmp_path / "cache")


@pytest.fixture
def loads(library, monkeypatch):
    """What ``load`` hands to dlopen, in a process whose ops are not loaded yet; builds write ``GOOD``."""
    if not native_kernels.cpu_path():
        pytest.skip("this CPU has no AVX2: the library is never loaded")
    handed, builds = [], []
    monkeypatch.setattr(native_kernels, "loaded", lambda: False)
    monkeypatch.setattr(torch.ops, "load_library", handed.append)

    def build(path):
        builds.append(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(GOOD)
        return ""
    monkeypatch.setattr(native_kernels, "build", build)
    return handed, builds


@pytest.mark.parametrize("damage, why", [
    (lambda path: path.write_bytes(b""), "0 bytes, not the 16000 it was built with"),
    (lambda path: path.write_bytes(GOOD[:5000]), "5000 bytes, not the 16000 it was built with"),
    (lambda path: path.write_bytes(GOOD[:-1] + b"!"), "its sha256 is not the one it was built with"),
    (lambda path: path.with_suffix(".sha256").write_text("[1"), "{record} is unreadable"),
    (lambda path: path.with_suffix(".sha256").write_text('{"size": 16000}'), "{record} is unreadable"),
], ids=["emptied", "truncated", "a byte changed", "a record not JSON", "a record without sha256"])
def test_a_library_that_is_not_what_was_built_is_built_again_with_one_warning_before_dlopen(library, loads, caplog, damage, why):
    handed, builds = loads
    built(library, GOOD)
    damage(library)
    with caplog.at_level(logging.INFO, logger="specdec"):
        assert native_kernels.available(library.parent.parent / "cache") is True
    assert builds == [library] and handed == [str(library)]
    why = why.format(record=library.with_suffix(".sha256").name)
    assert warnings(caplog) == [f"specdec's kernel library {library} was damaged ({why}): compiled it again"]
    assert json.loads(library.with_suffix(".sha256").read_text()) == record_of(GOOD)


def test_an_intact_library_is_loaded_as_it_is(library, loads, caplog):
    handed, builds = loads
    built(library, GOOD[:-1] + b"?")
    with caplog.at_level(logging.INFO, logger="specdec"):
        assert native_kernels.available(library.parent.parent / "cache") is True
    assert builds == [] and handed == [str(library)] and caplog.records == []


def test_a_library_from_before_the_records_is_built_again_without_a_warning(library, loads, caplog):
    """Every cache made before the records holds a library without one: built again once, quietly."""
    handed, builds = loads
    built(library, GOOD)
    library.with_suffix(".sha256").unlink()
    with caplog.at_level(logging.INFO, logger="specdec"):
        assert native_kernels.available(library.parent.parent / "cache") is True
    assert builds == [library] and handed == [str(library)]
    assert [r.getMessage() for r in caplog.records] == ["compiling specdec's int8 matmul kernel once (~20 s)"]
    assert json.loads(library.with_suffix(".sha256").read_text()) == record_of(GOOD)


def test_a_missing_library_is_built_and_recorded_after_it(library, loads, caplog):
    handed, builds = loads
    with caplog.at_level(logging.INFO, logger="specdec"):
        assert native_kernels.available(library.parent.parent / "cache") is True
    assert builds == [library] and handed == [str(library)]
    assert [r.getMessage() for r in caplog.records] == ["compiling specdec's int8 matmul kernel once (~20 s)"]
    assert json.loads(library.with_suffix(".sha256").read_text()) == record_of(GOOD)
    assert sorted(p.name for p in library.parent.iterdir()) == [library.with_suffix(".sha256").name, library.name]


def read_only(path):
    raise PermissionError(13, "Permission denied", str(path.parent / f".{path.name}.x"))


@pytest.mark.parametrize("cannot", ["compiler", "cache"])
def test_a_damaged_library_that_cannot_be_built_again_is_one_warning_and_torchs_kernels(library, loads, monkeypatch,
                                                                                     caplog, cannot):
    handed, _ = loads
    built(library, GOOD)
    library.write_bytes(b"")
    if cannot == "compiler":
        monkeypatch.setattr(native_kernels, "build", BUILD)
        monkeypatch.setenv("CXX", "/bin/false")
        reason = ("/bin/false is not a GCC-compatible C++ compiler (the kernels use GCC's target attributes): "
                  "set CXX to g++ or clang++")
    else:
        monkeypatch.setattr(native_kernels, "build", read_only)
        reason = f"[Errno 13] Permission denied: '{library.parent}/.{library.name}.x'"
    with caplog.at_level(logging.INFO, logger="specdec"):
        assert native_kernels.available(library.parent.parent / "cache") is False
        assert native_kernels.available(library.parent.parent / "cache") is False
    assert handed == []
    assert warnings(caplog) == [(
        f"specdec's int8 matmul kernel is not available ({library} is damaged (0 bytes, not the 16000 it was built "
        f"with) and cannot be compiled again: {reason}): the target runs on torch's int4/int8 kernels, whose verify "
        "blocks cost more")]


def test_a_library_that_cannot_be_written_at_all_is_one_warning_not_a_traceback(library, loads, monkeypatch, caplog):
    monkeypatch.setattr(native_kernels, "build", read_only)
    with caplog.at_level(logging.INFO, logger="specdec"):
        assert native_kernels.available(library.parent.parent / "cache") is False
    assert warnings(caplog) == [(
        f"specdec's int8 matmul kernel is not available ([Errno 13] Permission denied: '{library.parent}/."
        f"{library.name}.x'): the target runs on torch's int4/int8 kernels, whose verify blocks cost more")]


LOAD_AND_MULTIPLY = """
import sys, torch
from pathlib import Path
from specdec_cli.runtime import native_kernels
assert native_kernels.available(Path(sys.argv[1])), "specdec's kernels are not available"
g = torch.Generator().manual_seed(0)
codes, scale, offset = torch.randint(0, 16, (16, 64), generator=g), torch.full((16, 2), 0.5), torch.full((16, 2), -4.0)
x = torch.randint(-127, 128, (3, 64), generator=g).float()
x[:, ::32] = 127  # every block's codes exact: the product is exact
packed = native_kernels.pack(codes, scale, offset, 4)
got = native_kernels.bound().matmul(x, *packed, 4)
assert torch.equal(got.double(), x.double() @ native_kernels.unpack(*packed, 4).double().t()), got
print("ok")
"""


@pytest.fixture(scope="module")
def real_library() -> bytes:
    """The library as the compiler makes it here (the tests' cache keeps one)."""
    assert native_kernels.available(cache_root()), "specdec's kernels do not build here"
    return native_kernels.library_path(cache_root()).read_bytes()


@pytest.mark.slow  # a compile: ~30 s on a busy machine
def test_a_truncated_library_is_built_again_without_a_warning_and_its_ops_give_the_same_result(library, real_library):
    """Cut to 50 kB, dlopen died of SIGBUS on every run. A process of its own, so that a crash is a
    return code. (An emptied one, which left torch's kernels for good, takes the same path: the
    in-process cases above cover it without a second compile.) The suite's one real compile, so it
    also holds the library to a build without a warning under -Wall (what -Werror would fail on)."""
    size = 50_000
    built(library, real_library)
    library.write_bytes(real_library[:size])
    done = subprocess.run([sys.executable, "-c", LOAD_AND_MULTIPLY, str(library.parent.parent / "cache")],
                          capture_output=True, text=True, timeout=600, check=False)
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr
    assert [line for line in done.stderr.splitlines() if "damaged" in line or "not available" in line] == [(
        f"specdec's kernel library {library} was damaged ({size} bytes, not the {len(real_library)} it was built "
        "with): compiled it again")]
    assert json.loads(library.with_suffix(".sha256").read_text()) == record_of(library.read_bytes(), diagnostics="")


SANE = {1: 0.018, 2: 0.020, 3: 0.023}
MEASURED = {1: 0.017, 2: 0.021, 3: 0.022}


@pytest.mark.parametrize("content, why", [
    (b"[1, 2]", "list, not a mapping of block lengths to seconds"),
    (b"null", "NoneType, not a mapping of block lengths to seconds"),
    (b'"fast"', "str, not a mapping of block lengths to seconds"),
    (b"{}", "dict, not a mapping of block lengths to seconds"),
    (b'{"1": null}', "a cost of null, not a positive number of seconds"),
    (b'{"1": "0.01"}', 'a cost of "0.01", not a positive number of seconds'),
    (b'{"1": true}', "a cost of true, not a positive number of seconds"),
    (b'{"1": [0.01]}', "a cost of [0.01], not a positive number of seconds"),
    (b'{"1": NaN}', "a cost of NaN, not a positive number of seconds"),
    (b'{"1": Infinity}', "a cost of Infinity, not a positive number of seconds"),
    (b'{"1": 0.018, "2": -0.02}', "a cost of -0.02, not a positive number of seconds"),
    (b'{"1": 0}', "a cost of 0, not a positive number of seconds"),
    (b'{"2": 0.02, "3": 0.023}', "its block lengths are not 1 to 2"),
    (b'{"1": 0.018, "3": 0.023}', "its block lengths are not 1 to 2"),
    (b'{"1": 0.018, "01": 0.02}', "its block lengths are not 1 to 2"),
    (b'{"1": 0.018, "2": 0.02', "not JSON"),
    (b"\x89PNG\r\n\x00\xff", "not JSON"),
])
def test_a_block_cost_file_that_is_not_what_specdec_wrote_is_measured_again_with_one_warning(target, tmp_path,
                                                                                            monkeypatch, caplog,
                                                                                            content, why):
    monkeypatch.setattr(blocks, "time_blocks", lambda model, context: SANE)
    assert blocks.cached_costs(target, "tiny", tmp_path) == SANE
    [path] = tmp_path.glob("block-costs-*.json")
    path.write_bytes(content)
    monkeypatch.setattr(blocks, "time_blocks", lambda model, context: MEASURED)
    with caplog.at_level(logging.INFO, logger="specdec"):
        assert blocks.cached_costs(target, "tiny", tmp_path) == MEASURED
    assert warnings(caplog) == [f"the block costs in {path} are unusable ({why}): measuring them again"]
    assert json.loads(path.read_text()) == {str(n): s for n, s in MEASURED.items()}


def test_a_block_cost_file_as_specdec_wrote_it_is_read_back_without_a_word(target, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(blocks, "time_blocks", lambda model, context: SANE)
    blocks.cached_costs(target, "tiny", tmp_path)  # measured: says so (test_context_cost.py)
    monkeypatch.setattr(blocks, "time_blocks", lambda model, context: pytest.fail("measured again"))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="specdec"):
        assert blocks.cached_costs(target, "tiny", tmp_path) == SANE
    assert caplog.records == []
