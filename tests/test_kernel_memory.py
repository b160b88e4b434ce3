"""The weight-only kernels only ever read memory they were given, where they can read it: the probes run
in a process apart (kernel_memory_probe.py), so that a fault fails a test instead of the run. They run
together in one process (one import of torch); a case that did not print its ``ok`` there runs again
alone, so that a fault is laid at the case that caused it.

On AVX-512 torch's int8 kernel reads weight and input rows with aligned 16-byte loads: a row width
that is not a multiple of 16 bytes faults even on the heap, and so does a weight mapped from a file
at an offset that is not aligned (safetensors' offsets are only what the tensors before leave).
"""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).with_name("kernel_memory_probe.py")
# One worker runs the module: its cases run in one process (``batch``), once a test run, not once a worker.
pytestmark = [pytest.mark.cpu_kernels, pytest.mark.xdist_group("kernel-memory")]


def probe(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PROBE), *map(str, args)], capture_output=True, text=True, timeout=300)


def assert_ran(result: subprocess.CompletedProcess) -> None:
    if result.returncode < 0:
        name = signal.Signals(-result.returncode).name
        pytest.fail(f"the probe was killed by {name}: a kernel read memory it may not read\n{result.stderr[-2000:]}")
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-2000:]


def test_the_guard_page_kills_a_read_past_the_end():
    """Without this, a probe that passes could be one whose guard guards nothing."""
    assert probe("touch").returncode == -signal.SIGSEGV


GUARDED = [
    ("int8", 98, 32), ("int8", 65, 576), ("int8", 49, 40), ("int8", 7, 24),  # 40 and 24: rows padded to 16 bytes
    ("int4", 98, 32), ("int4", 65, 576), ("int4", 200, 64),
]
MAPPED = [("int8", 32), ("int8", 40), ("int4", 32)]
NATIVE = [(4, 40, 96), (8, 40, 96), (4, 65, 576), (8, 7, 32)]  # specdec's matmul: bits, outputs, inputs
ATTEND = [(1, 5, 48), (3, 17, 64), (4, 33, 128), (2, 9, 24)]  # specdec's attention: rows, keys, head dim


def case(name: str, *values) -> str:
    return ":".join(map(str, (name, *values)))


@pytest.fixture(scope="module")
def batch() -> set[str]:
    """The cases that printed their ``ok`` in one process running them all."""
    cases = ([case("guard", *g) for g in GUARDED] + [case("prepared", *m) for m in MAPPED]
             + [case("native", *n) for n in NATIVE] + [case("attend", *a) for a in ATTEND])
    result = probe("batch", *cases)
    return {line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("ok ")}


def assert_case_ran(batch: set[str], name: str, *values) -> None:
    if case(name, *values) not in batch:
        assert_ran(probe(name, *values))


@pytest.mark.parametrize("kind, out_features, in_features", GUARDED)
def test_no_kernel_reads_past_its_weight(batch, kind, out_features, in_features):
    assert_case_ran(batch, "guard", kind, out_features, in_features)


@pytest.mark.parametrize("kind, hidden", MAPPED)
def test_a_target_mapped_from_its_prepared_file_runs_and_scores_as_built(batch, kind, hidden):
    assert_case_ran(batch, "prepared", kind, hidden)


@pytest.mark.parametrize("bits, out_features, in_features", NATIVE)
def test_specdecs_matmul_reads_no_byte_past_its_tensors(batch, bits, out_features, in_features):
    assert_case_ran(batch, "native", bits, out_features, in_features)


@pytest.mark.parametrize("rows, keys, dim", ATTEND)
def test_specdecs_attention_reads_no_byte_past_its_tensors(batch, rows, keys, dim):
    assert_case_ran(batch, "attend", rows, keys, dim)
