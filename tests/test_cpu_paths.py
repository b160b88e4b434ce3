"""The kernel-dependent tests (marked ``cpu_kernels``) once more on AVX2's kernels.

torch picks its CPU kernels by the CPU's capability, and the paths differ in more than speed: on
AVX-512 the int8 kernel faults on rows that are not 16-byte aligned, where AVX2's reads them. On a
machine above AVX2 this runs the test run's marked tests again in a pytest of their own under
``ATEN_CPU_CAPABILITY=avx2``, so that neither path breaks unnoticed on a machine that has the other.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import MARKED_FILES

VARIABLE = "ATEN_CPU_CAPABILITY"


@pytest.mark.cpu_kernels
def test_torch_runs_the_kernels_this_run_asked_for():
    asked = os.environ.get(VARIABLE)
    if not asked:
        pytest.skip(f"{VARIABLE} is not set: torch runs this CPU's best kernels")
    assert torch.backends.cpu.get_cpu_capability() == asked.upper()


def nested_environment() -> dict[str, str]:
    """This environment on AVX2's kernels, less xdist's worker variables: the nested pytest is no
    worker (one that thought it was would look for loadgroup's option). It computes on as many
    threads as this worker does (one beside another worker: conftest), or its forwards stall."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_XDIST_")}
    return {**environment, VARIABLE: "avx2", "OMP_NUM_THREADS": str(torch.get_num_threads())}


@pytest.mark.slow
def test_the_kernel_tests_pass_on_avx2_kernels_too(request):
    if os.environ.get(VARIABLE):
        pytest.skip(f"this run chose its kernels ({VARIABLE}={os.environ[VARIABLE]})")
    capability = torch.backends.cpu.get_cpu_capability()
    if not capability.startswith("AVX512"):
        pytest.skip(f"this CPU runs {capability} kernels: the marked tests ran on them already")
    files = request.config.stash[MARKED_FILES] or [str(Path(__file__).parent)]  # chosen alone (-k): every marked test
    run = subprocess.run([sys.executable, "-m", "pytest", "-m", "cpu_kernels", "-q", "-n", "0", "-p", "no:cacheprovider",
                          *files], env=nested_environment(),
                         capture_output=True, text=True, timeout=1800)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, f"on AVX2's kernels: {summary}\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
    assert " passed" in summary, summary
