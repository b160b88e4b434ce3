"""The weight-only kernels only ever read memory they were given, where they can read it: each probe runs
in a process of its own (kernel_memory_probe.py), so that a fault fails one test instead of the run.

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
pytestmark = pytest.mark.cpu_kernels


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


@pytest.mark.parametrize("kind, out_features, in_features", [
    ("int8", 98, 32), ("int8", 65, 576), ("int8", 49, 40), ("int8", 7, 24),  # 40 and 24: rows padded to 16 bytes
    ("int4", 98, 32), ("int4", 65, 576), ("int4", 200, 64),
])
def test_no_kernel_reads_past_its_weight(kind, out_features, in_features):
    assert_ran(probe("guard", kind, out_features, in_features))


@pytest.mark.parametrize("kind, hidden", [("int8", 32), ("int8", 40), ("int4", 32)])
def test_a_target_mapped_from_its_prepared_file_runs_and_scores_as_built(kind, hidden):
    assert_ran(probe("prepared", kind, hidden))
