"""A pytest plugin: the CPU seconds of each test, its process's own and those of the processes it
started and reaped (a server that outlives its test, such as the run's shared vLLM servers, counts for
the test in which it is reaped; one reaped by nobody counts nowhere). Each test process writes
``cpu-WORKER.tsv`` (own, reaped, node id) into ``$CPU_METER_DIR`` (default: the current directory);
run as a script, it prints the largest and the sums:

    CPU_METER_DIR=/tmp/cpu PYTHONPATH=benchmarks python3 -m pytest -p cpu_meter -p no:randomly
    python3 benchmarks/cpu_meter.py /tmp/cpu
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

import pytest

ROWS: list[tuple[float, float, str]] = []


def _seconds() -> tuple[float, float]:
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before = _seconds()
    yield
    after = _seconds()
    ROWS.append((after[0] - before[0], after[1] - before[1], item.nodeid))


def pytest_unconfigure(config):
    if not ROWS:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    path = Path(os.environ.get("CPU_METER_DIR", ".")) / f"cpu-{worker}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{own:.3f}\t{reaped:.3f}\t{node}\n" for own, reaped, node in ROWS))


def main() -> None:
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    rows = [line.split("\t", 2) for path in sorted(directory.glob("cpu-*.tsv")) for line in path.read_text().splitlines()]
    rows = [(float(own), float(reaped), node) for own, reaped, node in rows]
    print(f"{len(rows)} tests: {sum(r[0] for r in rows):.0f} CPU-s in the test processes, "
          f"{sum(r[1] for r in rows):.0f} in the processes they reaped")
    for own, reaped, node in sorted(rows, key=lambda r: -(r[0] + r[1]))[:40]:
        print(f"{own + reaped:7.1f} {own:7.1f} {reaped:7.1f}  {node}")


if __name__ == "__main__":
    main()
