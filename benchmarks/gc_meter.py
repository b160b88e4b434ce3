"""A pytest plugin: the garbage collector's collections and seconds in each test process, by
generation, with the suite's objects frozen after collection (tests/conftest.py) or, with
``SPECDEC_GC_UNFROZEN=1``, not. Each process prints one line to the terminal when its run ends:

    PYTHONPATH=benchmarks python3 -m pytest -m "not slow" -p gc_meter -p no:randomly
    SPECDEC_GC_UNFROZEN=1 PYTHONPATH=benchmarks python3 -m pytest -m "not slow" -p gc_meter -p no:randomly
"""

from __future__ import annotations

import gc
import os
import sys
import time

import pytest

COUNTS = [0, 0, 0]
SECONDS = [0.0, 0.0, 0.0]
_STARTED = [0.0]


def _observe(phase: str, info: dict) -> None:
    if phase == "start":
        _STARTED[0] = time.perf_counter()
        return
    generation = info["generation"]
    COUNTS[generation] += 1
    SECONDS[generation] += time.perf_counter() - _STARTED[0]


def pytest_configure(config):
    gc.callbacks.append(_observe)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish():
    if os.environ.get("SPECDEC_GC_UNFROZEN"):
        gc.unfreeze()


def pytest_unconfigure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    seconds = ", ".join(f"{s:.2f}" for s in SECONDS)
    print(f"\ngc {worker}: collections by generation {COUNTS}, seconds {seconds}, "
          f"{gc.get_freeze_count()} objects frozen", file=sys.__stderr__, flush=True)
