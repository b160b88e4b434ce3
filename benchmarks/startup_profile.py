"""Where a warm start goes: imports by package (``python -X importtime``) and the command's own steps
(cProfile's cumulative seconds, which the profiler inflates a little), for one run of a command.

    python3 benchmarks/startup_profile.py                      # generate --json -k 0 --max-new-tokens 1 Hi
    python3 benchmarks/startup_profile.py generate --json -k auto --max-new-tokens 1 Hi

Run it from the tree to profile, with that tree on PYTHONPATH, after one run has prepared the target
(docs/performance.md, "Start-up"); on an idle machine (../shared/tools/quiet-check), as startup.sh.
"""

from __future__ import annotations

import collections
import os
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path

COMMAND = ["generate", "--json", "-k", "0", "--max-new-tokens", "1", "Hi"]
# The command's steps: (label, a function's file:line name as cProfile lists it).
STEPS = [
    ("the CLI's modules (typer, rich, commands)", "specdec_cli/cli.py", "<module>"),
    ("the look at the machine (what is left of it)", "runtime/threads.py", "choose_before_torch"),
    ("torch and the decoding modules imported", "decoding/loaded_pair.py", "<module>"),
    ("the tokenizer", "pairs/loading.py", "target_tokenizer"),
    ("the prepared target mapped", "pairs/loading.py", "quantised_target"),
    ("the draft head loaded", "decoding/drafters/head.py", "load_head"),
    ("the block costs read", "decoding/blocks.py", "cached_costs"),
    ("the prompt and the tokens", "commands/generate.py", "_run_one"),
]
PROBE = """
import atexit, cProfile, sys
profile = cProfile.Profile()
atexit.register(lambda: (profile.disable(), profile.dump_stats(path)))
path, sys.argv = sys.argv[1], ["specdec", *sys.argv[2:]]
profile.enable()
from specdec_cli.cli import main
main()
"""


def imports_by_package(report: str) -> dict[str, float]:
    """``-X importtime``'s self times summed by top-level package, in seconds."""
    totals: dict[str, float] = collections.defaultdict(float)
    for line in report.splitlines():
        if line.startswith("import time:") and "|" in line and "self [us]" not in line:
            self_us, _, name = line.removeprefix("import time:").split("|")
            totals[name.strip().split(".")[0]] += int(self_us) / 1e6
    return totals


def steps(path: str) -> list[tuple[str, float]]:
    """Each step's cumulative seconds from the profile (0 where the command did not take it)."""
    stats = pstats.Stats(path).stats  # (file, line, name) -> (calls, primitive, own, cumulative, callers)
    found = []
    for label, file, name in STEPS:
        seconds = max((row[3] for (f, _, n), row in stats.items() if f.endswith(file) and n == name), default=0.0)
        found.append((label, seconds))
    return found


def main(command: list[str]) -> None:
    root = Path(__file__).resolve().parents[1]
    env = os.environ | {"PYTHONPATH": str(root)}
    timed = subprocess.run([sys.executable, "-X", "importtime", "-m", "specdec_cli", *command], cwd=root, env=env,
                           capture_output=True, text=True, check=True)
    totals = imports_by_package(timed.stderr)
    print(f"imports, self time by package ({sum(totals.values()):.2f} s in all):")
    for name, seconds in sorted(totals.items(), key=lambda item: -item[1])[:12]:
        print(f"  {name:28} {seconds:6.3f} s")
    with tempfile.NamedTemporaryFile(suffix=".prof") as out:
        subprocess.run([sys.executable, "-c", PROBE, out.name, *command], cwd=root, env=env, capture_output=True,
                       check=True)
        print("steps, cumulative (profiled):")
        for label, seconds in steps(out.name):
            print(f"  {label:48} {seconds:6.3f} s")


if __name__ == "__main__":
    main(sys.argv[1:] or COMMAND)
