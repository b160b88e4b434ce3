"""How many CPU threads torch runs, and how they wait: chosen before torch loads.

OpenMP's worker threads spin at every barrier while they wait for each other. On an idle machine
that is the fastest way to wait; when another process holds one of the cores, two spinning threads
fight it for the CPU and every op waits on the descheduled one: with the int4 target on this
project's 2-core machine, one busy process slowed plain decoding to a crawl. A passive wait
(threads sleep) survives that, but on an idle machine its wake-ups cost much of the speed of the
int4 target, whose tokens are many small ops. No single policy serves both (docs/performance.md,
"Threads"), so the CLI looks before it starts: where other processes keep cores busy it runs on
the cores left free with a passive wait; on an idle machine it leaves OpenMP's own default. A user
who set OMP_NUM_THREADS or OMP_WAIT_POLICY decides alone; `--threads N` sets the count.

The look samples the machine for a tenth of a second, so only a command that computes takes it
(``apply``, before it imports torch), once a process: `--help`, a usage error or `specdec models`
start without it. The command line opens the sample as any command starts (``begin_look``: one reading
of /proc/stat, no wait), so that typer's building and parsing fill the tenth of a second that a computing
command then completes, this process's own CPU time left out of the count.
"""

from __future__ import annotations

import os
import sys
import time

WAIT_POLICY = "OMP_WAIT_POLICY"
COUNT = "OMP_NUM_THREADS"
SAMPLE_S = 0.1
_chosen_by = "user"
_chosen = False  # whether this process has chosen (or found torch loaded first)
_begun: tuple[float, int, int, float] | None = None  # the open sample: wall time, /proc/stat ticks, own CPU


def thread_settings(cores: int, busy: float) -> dict[str, str]:
    """The OpenMP settings for a machine of ``cores`` with ``busy`` cores' worth of other work:
    none on an idle machine (OpenMP's default), else the free cores (at least one), waiting passively."""
    taken = min(cores - 1, round(busy))
    if taken <= 0:
        return {}
    return {COUNT: str(cores - taken), WAIT_POLICY: "PASSIVE"}


def reading() -> tuple[float, int, int, float]:
    """Now: wall seconds, the machine's CPU ticks in all and idle (/proc/stat, all cores) and this
    process's own CPU seconds; ``OSError`` or ``ValueError`` where /proc/stat cannot be read."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return time.monotonic(), sum(fields), idle, time.process_time()


def others_busy(start: tuple[float, int, int, float], end: tuple[float, int, int, float], cores: int) -> float:
    """Cores' worth of CPU time other processes used between two readings: the machine's busy ticks
    less this process's own CPU time."""
    elapsed = end[1] - start[1]
    if elapsed <= 0:
        return 0.0
    own = (end[3] - start[3]) * os.sysconf("SC_CLK_TCK")
    busy = (elapsed - (end[2] - start[2])) - own
    return max(0.0, busy / elapsed * cores)


def begin_look() -> None:
    """Open the sample as a command starts (cli.py); cheap: one reading, no wait and no decision, which
    only a command that computes makes (``apply``)."""
    global _begun
    if _begun is None and not _chosen:
        try:
            _begun = reading()
        except (OSError, ValueError, IndexError):
            pass


def busy_cores(sample_s: float = SAMPLE_S) -> float:
    """Cores' worth of CPU time other processes used over at least ``sample_s``, from the sample
    ``begin_look`` opened (only the rest is waited for), else from now; 0 where /proc/stat cannot be read."""
    try:
        start = _begun or reading()
        time.sleep(max(0.0, sample_s - (time.monotonic() - start[0])))
        return others_busy(start, reading(), os.cpu_count() or 1)
    except (OSError, ValueError, IndexError):
        return 0.0


# MKL picks its code path per call, by the inputs' memory alignment among other things, so the same
# float32 op could round differently from one process to the next, and an int4 greedy run of one
# prompt ended at different lengths from run to run; with MKL's reproducible AVX2 path every run
# gave the same tokens at the same speed (docs/precision.md).
REPRODUCIBLE = {"MKL_CBWR": "AVX2"}


def choose_before_torch() -> None:
    """Effective only before torch (and its OpenMP runtime and MKL) load, so it chooses nothing once
    torch is loaded (a program that imported it first); once a process; a user's own settings win."""
    global _chosen_by, _chosen
    if _chosen:
        return
    _chosen = True
    if "torch" in sys.modules:
        _chosen_by = "nobody (torch was loaded before specdec could choose)"
        return
    for name, value in REPRODUCIBLE.items():
        os.environ.setdefault(name, value)
    if WAIT_POLICY in os.environ or COUNT in os.environ:
        return
    busy = busy_cores()
    settings = thread_settings(os.cpu_count() or 1, busy)
    os.environ.update(settings)
    _chosen_by = f"specdec ({busy:.1f} cores busy at start)"


# `--threads` takes at most THREADS_PER_CORE threads a core. More threads than cores only take turns
# on them, and every op waits at its barrier for the last one descheduled (one busy core slows the
# int4 target to a crawl, above), so a few per core leave room to measure oversubscription on
# purpose and nothing past that helps; thousands break OpenMP itself (hangs, libgomp errors,
# segfaults: docs/notebook.md, "Figures that were in the code's docstrings").
THREADS_PER_CORE = 4


def most_threads() -> int:
    """The largest `--threads` this machine takes: THREADS_PER_CORE for each of its cores."""
    return THREADS_PER_CORE * (os.cpu_count() or 1)


def apply(threads: int | None) -> None:
    """A computing command's threads, before it imports torch: the look at the machine
    (``choose_before_torch``), then `--threads N`, torch's intra-op thread count (None keeps torch's own)."""
    choose_before_torch()
    if threads is None:
        return
    import torch

    torch.set_num_threads(threads)


def policy(threads: int | None = None) -> dict:
    """What a manifest records: the thread count in use, where it came from, and the wait policy."""
    import torch

    if threads is not None:
        source = "--threads"
    elif os.environ.get("OMP_NUM_THREADS"):
        source = "OMP_NUM_THREADS"
    else:
        source = "torch default"
    return {
        "torch_threads": torch.get_num_threads(),
        "threads_from": source,
        "omp_wait_policy": os.environ.get(WAIT_POLICY, "unset (OpenMP's default)"),
        "chosen_by": _chosen_by,
    }
