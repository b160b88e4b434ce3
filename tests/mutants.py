"""Mutation testing, small: plant one simple bug at a time in a source file and see whether the tests fail.

Not a test module (pytest does not collect it). Run it from the repository root:

    python3 tests/mutants.py specdec_cli/decoding/acceptance.py specdec_cli/decoding/tree.py

Each mutant swaps one operator or constant (< <=, > >=, == !=, + -, * /, min max, and or, 0 1,
0.0 1.0, True False), is written over the file, and the file's quick test set runs under
``pytest -x`` with a timeout: a failing run (or a timeout) kills the mutant, a passing one lets it
survive. The original file is written back after each run, at exit and on SIGINT/SIGTERM.

Options: --modules ARG... (pytest arguments instead of the file's quick set), --limit N and --seed S
(a fixed random sample of the mutants), --only ID... (rerun some, IDs as printed: file:line:col),
--timeout SECONDS (300), --out FILE (the results as JSON), --list (print the mutants, run nothing).
"""

from __future__ import annotations

import argparse
import ast
import atexit
import importlib.util
import itertools
import json
import os
import random
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLOW = ("tests/test_tree_controller.py::test_the_controllers_tree_rounds_keep_the_targets_exact_distribution",  # 70 s
        "tests/test_lossy_rules.py::test_engine_with_the_exact_rule_passes_it",  # 180 s
        "tests/test_lossy_rules.py::test_engine_with_a_lossy_rule_fails_the_exact_distribution_test",  # 65 s
        "tests/test_lossy_rules.py::test_lenient_one_is_the_exact_distribution_and_lenient_two_is_not",  # 30-200 s
        "tests/test_lossy_rules.py::test_top_and_typical_change_the_first_token_distribution")  # 2 x 15-35 s
# The tests that exercise each file and take seconds, not minutes; test_tree_engine.py (4 min), test_engine_round.py
# and test_verify.py reach these files through whole engines: pass them with --modules.
QUICK = {
    "acceptance.py": ["tests/test_acceptance.py", "tests/test_lossy_rules.py"],
    "coupling.py": ["tests/test_coupling.py", "tests/test_tree.py"],
    "tree.py": ["tests/test_tree.py", "tests/test_tree_controller.py",
                "tests/test_tree_engine.py::test_best_nodes_keep_parents_with_their_children"],
}
COMPARE = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
           ast.Eq: ("==", "!="), ast.NotEq: ("!=", "==")}
ARITH = {ast.Add: ("+", "-"), ast.Sub: ("-", "+"), ast.Mult: ("*", "/"), ast.Div: ("/", "*")}
CONSTANTS = {"0": "1", "1": "0", "0.0": "1.0", "1.0": "0.0", "True": "False", "False": "True"}  # by text: 0 == 0.0 == False
_originals: dict[Path, str] = {}
_running: list[subprocess.Popen] = []  # the test run in progress, ended with us


@dataclass
class Mutant:
    id: str  # file:line:col of the replaced text
    path: str
    start: int  # character offsets of the replaced text in the file
    end: int
    before: str
    after: str
    shown: str  # the mutated expression, for the table
    status: str = "not run"


def offsets(source: str) -> list[int]:
    """Character offset of each line's start: ast positions are (line, column) pairs."""
    starts, total = [0], 0
    for line in source.splitlines(keepends=True):
        total += len(line)
        starts.append(total)
    return starts


def gaps(parts, old: str, source: str, at):
    """An operator lies between two operands: (start, end) of its text there, so that only it is replaced."""
    for left, right in itertools.pairwise(parts):
        start, end = at(left.end_lineno, left.end_col_offset), at(right.lineno, right.col_offset)
        where = source.find(old, start, end)
        if where >= 0:
            yield where, where + len(old)


def candidates(tree: ast.AST, source: str):
    """(start, end, before, after, node to show) for every simple mutation the file offers."""
    starts = offsets(source)
    parent = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def at(line, col):  # ast columns count UTF-8 bytes
        return starts[line - 1] + len(source[starts[line - 1]:].encode()[:col].decode())

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):  # one mutant per operator of a chain
            operands = [node.left, *node.comparators]
            for i, op in enumerate(node.ops):
                if type(op) in COMPARE:
                    old, new = COMPARE[type(op)]
                    yield from ((*gap, old, new, node) for gap in gaps(operands[i:i + 2], old, source, at))
        elif isinstance(node, ast.BinOp) and type(node.op) in ARITH:
            old, new = ARITH[type(node.op)]
            yield from ((*gap, old, new, node) for gap in gaps([node.left, node.right], old, source, at))
        elif isinstance(node, ast.BoolOp):  # one mutant per "and" of a chain: a and b and c → a or b and c
            old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
            yield from ((*gap, old, new, node) for gap in gaps(node.values, old, source, at))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max"):
            f = node.func
            new = "max" if f.id == "min" else "min"
            yield at(f.lineno, f.col_offset), at(f.end_lineno, f.end_col_offset), f.id, new, node
        elif isinstance(node, ast.Constant) and not isinstance(node.value, str):
            start, end = at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)
            shown = parent.get(node, node)  # shown with what it is an operand of (-1: with what -1 is one of)
            shown = parent.get(shown, shown) if isinstance(shown, ast.UnaryOp) else shown
            if source[start:end] in CONSTANTS:
                yield start, end, source[start:end], CONSTANTS[source[start:end]], shown


def mutants(path: Path) -> list[Mutant]:
    """Every mutant of one file that still parses, with the mutated expression to show it by."""
    source = path.read_text()
    starts = offsets(source)
    found = []
    for start, end, before, after, node in sorted(candidates(ast.parse(source), source), key=lambda c: c[:2]):
        mutated = source[:start] + after + source[end:]
        try:
            tree = ast.parse(mutated)
        except SyntaxError:
            continue
        line = next(i for i, s in enumerate(starts) if s > start)  # 1-based line of the change
        where = (getattr(node, "lineno", None), getattr(node, "col_offset", None))
        shown = next((ast.unparse(n).splitlines()[0] for n in ast.walk(tree) if type(n) is type(node)
                      and (getattr(n, "lineno", None), getattr(n, "col_offset", None)) == where), after)
        found.append(Mutant(f"{path.name}:{line}:{start - starts[line - 1]}", str(path.relative_to(ROOT)),
                            start, end, before, after, shown))
    return found


def restore(*_):
    """Write every mutated file back; on a signal, end the test run and exit after that."""
    for process in _running:
        process.kill()  # the rest of its process group, if any, ends with its pipes
    for path, text in _originals.items():
        if path.read_text() != text:
            path.write_text(text)
        drop_bytecode(path)
    if _:
        sys.exit(130)


def drop_bytecode(path: Path) -> None:
    """A mutant of the same size written in the same second would pass pyc's mtime check: never keep one."""
    Path(importlib.util.cache_from_source(str(path))).unlink(missing_ok=True)


def run_tests(args: list[str], timeout: float) -> str:
    """killed (a test failed, or a timeout, or the file no longer imports) or survived."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", *args]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    _running.append(process)
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return "killed (timeout)"
    finally:
        _running.remove(process)
    return "survived" if code == 0 else "killed" if code in (1, 2, 3) else f"error (exit {code})"  # 4: usage


def pytest_args(path: Path, modules: list[str] | None) -> list[str]:
    """The quick set for this file (every quick module for a file not in QUICK), slow tests left out."""
    if modules:
        return modules
    chosen = QUICK.get(path.name) or sorted({m for ms in QUICK.values() for m in ms})
    return [*chosen, *(f"--deselect={test}" for test in SLOW if test.split("::")[0] in chosen)]  # by prefix


def run(mutant: Mutant, modules: list[str] | None, timeout: float) -> str:
    """Write the mutant, run the tests, and put the original back whatever happens."""
    path = ROOT / mutant.path
    original = _originals[path]
    try:
        path.write_text(original[:mutant.start] + mutant.after + original[mutant.end:])
        drop_bytecode(path)
        return run_tests(pytest_args(path, modules), timeout)
    finally:
        path.write_text(original)
        drop_bytecode(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--modules", nargs="+", help="pytest arguments instead of each file's quick set")
    parser.add_argument("--limit", type=int, help="run a random sample of this many mutants")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="+", help="run only these mutant ids (file:line:col)")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    parser.add_argument("--list", action="store_true", help="print the mutants and run none")
    args = parser.parse_args()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, restore)
    atexit.register(restore)
    chosen = []
    for path in args.files:
        _originals[path.resolve()] = path.resolve().read_text()  # before any mutant is written
        chosen += mutants(path.resolve())
    if args.only:
        chosen = [m for m in chosen if m.id in args.only]
    if args.limit and args.limit < len(chosen):
        chosen = sorted(random.Random(args.seed).sample(chosen, args.limit), key=lambda m: (m.path, m.start))
    for args_set in {tuple(pytest_args(ROOT / m.path, args.modules)) for m in chosen} if not args.list else ():
        if (baseline := run_tests(list(args_set), args.timeout)) != "survived":  # a mutant must be what fails them
            print(f"the unmutated files do not pass {' '.join(args_set)}: {baseline}")
            return 2
    for i, mutant in enumerate(chosen, 1):
        if not args.list:
            mutant.status = run(mutant, args.modules, args.timeout)
        print(f"[{i}/{len(chosen)}] {mutant.id:24} {mutant.before!r} -> {mutant.after!r}: {mutant.shown[:60]:60} "
              f"{mutant.status}", flush=True)
    killed = sum(m.status.startswith("killed") for m in chosen)
    survived = [m for m in chosen if m.status == "survived"]
    print(f"\n{len(chosen)} mutants: {killed} killed, {len(survived)} survived")
    for m in survived:
        print(f"  survived {m.id}: {m.before!r} -> {m.after!r} in {m.shown}")
    if args.out:
        args.out.write_text(json.dumps([asdict(m) for m in chosen], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
