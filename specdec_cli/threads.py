"""How torch's CPU threads wait, and how many there are.

OpenMP's worker threads spin at every barrier while they wait for each other. On an idle machine
that saves a wake-up; when another process holds one of the cores, the spinning threads fight it
for the CPU and every forward waits on the slowest of them: on this project's 2-core machine one
busy process made generation 6× slower. A passive wait (the threads sleep) keeps the speed on a
busy machine and costs next to nothing on an idle one (README, "Threads"), so the CLI asks for it
before torch is imported, unless the user chose a policy. `--threads N` sets the count.
"""

from __future__ import annotations

import os

WAIT_POLICY = "OMP_WAIT_POLICY"
_chosen_by = "user"


def passive_wait_unless_set() -> None:
    """Ask OpenMP for a passive wait; effective only before torch (and its OpenMP runtime) loads."""
    global _chosen_by
    if WAIT_POLICY not in os.environ:
        os.environ[WAIT_POLICY] = "PASSIVE"
        _chosen_by = "specdec"


def apply(threads: int | None) -> None:
    """`--threads N`: torch's intra-op thread count for this run (None keeps torch's own choice)."""
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
        "omp_wait_policy": os.environ.get(WAIT_POLICY, "unset"),
        "wait_policy_from": _chosen_by if WAIT_POLICY in os.environ else "unset",
    }
