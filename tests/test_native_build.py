"""specdec's kernel library built and called like a library's: warnings on and clean, torch's ABI,
a compiler that cannot build it refused in one line, a bounded compile, and ops that refuse what
would otherwise be undefined (a CPU without the instructions, a key outside the cache) or define it
(non-finite activations)."""

from __future__ import annotations

import fnmatch
import math
import subprocess
import tomllib
from pathlib import Path

import pytest
import torch

from specdec_cli.pairs.cache_dir import cache_root
from specdec_cli.runtime import native_kernels

pytestmark = pytest.mark.cpu_kernels


@pytest.fixture(scope="module")
def kernels():
    assert native_kernels.available(cache_root()), "specdec's kernels do not build here"
    return native_kernels.bound()


def script(tmp_path, body: str) -> str:
    path = tmp_path / "cxx"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_a_compiler_that_is_not_gcc_compatible_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", script(tmp_path, "exit 0"))  # defines no __GNUC__
    with pytest.raises(native_kernels.Unavailable, match=r"cxx is not a GCC-compatible C\+\+ compiler .*set CXX to g\+\+"):
        native_kernels.build(tmp_path / "k.so")
    assert list(tmp_path.iterdir()) == [tmp_path / "cxx"]  # no staging file left


def test_a_compile_that_hangs_is_stopped_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", script(tmp_path, 'case "$*" in *-dM*) echo "#define __GNUC__ 13";; *) exec sleep 60;; esac'))
    monkeypatch.setattr(native_kernels, "COMPILE_SECONDS", 1)
    with pytest.raises(native_kernels.Unavailable, match=r"compiling specdec's kernels \(.*cxx\) took more than 1 s"):
        native_kernels.build(tmp_path / "k.so")


def test_the_compile_line_has_torchs_abi_and_headers_as_system_headers():
    line = native_kernels.command("g++", [], "out.so")
    assert f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}" in line
    assert "-Wall" in line and "-w" not in line
    assert sum(arg.startswith("-isystem") for arg in line) == 2 and not any(arg.startswith("-I") for arg in line)


@pytest.mark.skipif(torch.cpu._is_vnni_supported(), reason="this CPU has AVX-512 VNNI: the call is right here")
def test_an_avx512_call_on_a_cpu_without_it_is_an_error_not_sigill(kernels):
    """Run in a process of its own, so that a SIGILL shows as its exit status instead of ending the run."""
    code = ("import torch; from specdec_cli.pairs.cache_dir import cache_root; from specdec_cli.runtime import native_kernels as n\n"
            "n.load(cache_root()); x = torch.randn(1, 32); w = n.pack(torch.zeros(16, 32, dtype=torch.long), torch.ones(16, 1), torch.zeros(16, 1), 4)\n"
            "try:\n    n.op('q8_matmul')(x, *w, 4, True)\nexcept RuntimeError as exc:\n    print(str(exc).splitlines()[0])\n"
            "try:\n    n.op('attend_rows')([torch.randn(1, 2, 8)], [torch.randn(1, 3, 8)], [torch.randn(1, 3, 8)], [torch.tensor([3])], [None], 1.0, True)\n"
            "except RuntimeError as exc:\n    print(str(exc).splitlines()[0])\n")
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["specdec's kernels: this CPU has no AVX-512 VNNI (call them with avx512=False)"] * 2


@pytest.mark.parametrize("bad", [5, 17, -1])
def test_an_index_naming_a_key_outside_the_cache_is_an_error(kernels, bad):
    q, key, value = torch.randn(2, 4, 16), torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    index = torch.tensor([[0, 1, 2, 3], [0, 1, bad, 3]])
    with pytest.raises(RuntimeError, match=f"index: row 1 names key {bad} of 5"):
        kernels.attend_rows([q], [key], [value], [torch.tensor([4, 4])], [index], 0.25)
    index[1, 2] = 4
    assert kernels.attend_rows([q], [key], [value], [torch.tensor([4, 4])], [index], 0.25).isfinite().all()


@pytest.mark.parametrize("poison", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("bits", [4, 8])
def test_a_non_finite_activation_gives_nan_in_its_row_only(kernels, bits, poison):
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 2**bits, (40, 96), generator=g)
    scale = torch.rand(40, 3, generator=g) * 0.02 + 0.001
    packed = native_kernels.pack(codes, scale, -scale * 2 ** (bits - 1), bits)
    x = torch.randn(3, 96, generator=g)
    alone = [kernels.matmul(x[r:r + 1], *packed, bits) for r in range(3)]
    x[1, 50] = poison
    got = kernels.matmul(x, *packed, bits)
    assert got[1].isnan().all()
    assert torch.equal(got[0], alone[0][0]) and torch.equal(got[2], alone[2][0])


def test_a_nan_query_gives_nan_attention_for_its_row_only(kernels):
    q, key, value = torch.randn(2, 4, 16), torch.randn(2, 6, 16), torch.randn(2, 6, 16)
    counts = torch.tensor([5, 6])
    want = kernels.attend_rows([q], [key], [value], [counts], [None], 0.25)
    q[0, 1, 3] = math.nan
    got = kernels.attend_rows([q], [key], [value], [counts], [None], 0.25)
    assert got[0, 1].isnan().all() and torch.equal(got[1], want[1]) and torch.equal(got[0, 0], want[0, 0])


THREADS = """
import os, sys, torch
torch.set_num_threads(int(sys.argv[1]))
from specdec_cli.pairs.cache_dir import cache_root
from specdec_cli.runtime import native_kernels as n
n.load(cache_root())
tasks = lambda: len(os.listdir("/proc/self/task"))
torch.randn(512, 512) @ torch.randn(512, 512)  # torch's own pool, as --threads sized it
pool = tasks()
w = n.pack(torch.randint(0, 16, (4096, 512)), torch.rand(4096, 16), torch.zeros(4096, 16), 4)
for _ in range(3):
    n.bound().matmul(torch.randn(4, 512), *w, 4)
gomp = {line.split()[-1] for line in open("/proc/self/maps") if "libgomp" in line}
print(pool, tasks(), len(gomp))
"""


def test_the_librarys_parallel_loops_run_on_torchs_pool_of_threads(kernels):
    """The library links libgomp by soname, so it gets torch's runtime (one libgomp mapped) and its
    pool: a call adds no thread, and --threads (torch.set_num_threads) sizes what it runs on."""
    import sys

    counts = {}
    for threads in (1, 3):
        done = subprocess.run([sys.executable, "-c", THREADS, str(threads)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        pool, after, gomp = map(int, done.stdout.split())
        assert after == pool and gomp == 1, done.stdout
        counts[threads] = pool
    assert counts[3] - counts[1] >= 2  # at least the two more OpenMP workers that 3 threads need


def test_every_source_the_library_is_built_from_is_installed_with_the_package():
    # an install from a wheel compiles from the package's own copy of native/: a header left out of
    # the package data fails that compile, and the target runs on torch's kernels
    config = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["specdec_cli"]
    package = Path(native_kernels.__file__).parents[1]
    named = [str(p.relative_to(package)) for p in native_kernels.sources()]
    assert {"runtime/native/cpu_features.h", "runtime/native/attention_wide.inc"} <= set(named)
    assert [n for n in named if not any(fnmatch.fnmatch(n, g) for g in globs)] == []
