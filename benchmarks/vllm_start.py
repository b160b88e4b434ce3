"""What a vLLM server's start costs, in vLLM's default process layout and with its model run in the
engine's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; tried for the tests' servers, not kept:
docs/testing.md): seconds to ready and the CPU seconds of the server's whole process group at that
moment, the layouts alternating.
Needs `bash install.sh test` (vLLM's environment; the default pair is converted on first use):

    python3 benchmarks/vllm_start.py --rounds 2
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

LAYOUTS = {"three processes (vLLM's default)": "1", "two processes (the model in the engine's)": "0"}


def group_cpu_s(pgid: int) -> float:
    """User and system seconds of every live process in group ``pgid``, with those of the children
    each has reaped."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += sum(int(f) for f in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from specdec_cli.pairs.loading import transformers_directory
    from specdec_cli.pairs.registry import load_registry
    from specdec_cli.serving.server import ManagedServer, ServerConfig

    model_dir = transformers_directory(load_registry(None).pair(None).target.source)
    for _ in range(args.rounds):
        for name, switch in LAYOUTS.items():
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = switch  # the server's environment copies this one
            with ManagedServer(ServerConfig("vllm-plain", model_dir, "smol", threads=1)) as server:
                cpu = group_cpu_s(server.process.pid)
                print(f"{name}: ready in {server.started_s:.1f} s, {cpu:.1f} CPU-s", flush=True)


if __name__ == "__main__":
    main()
