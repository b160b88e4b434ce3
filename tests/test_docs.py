"""The project's own text: files describe the project, never who worked on it when; the README stays a
short user's guide that links the docs (all but the measurement notebook); benchmarks/ keeps a guide to
its scripts and only the result files a figure cites; `specdec --version` answers from the package
metadata."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("specdec_cli", "docs", "benchmarks", "tests", "README.md")
TERM = "ses" + "sion"  # spelt in two halves so that this file passes its own scan
# The record of past runs and experiments: not part of the user's guide (the README does not link it), and
# the result files it names may be ones that only git history keeps.
NOTEBOOK = "docs/notebook.md"
CITED = re.compile(r"benchmarks/[\w./*+-]*\w")
WORD = re.compile(TERM, re.IGNORECASE)

# Legitimate uses, each with its reason. Files: (glob, reason); lines: (regex, reason).
ALLOWED_FILES = [
    ("specdec_cli/trained/*/tokenizer.json", "the tokenizer's vocabulary holds the word as a token"),
]
ALLOWED_LINES = [
    (re.compile(rf'scope="{TERM}"'), "pytest's fixture scope keyword"),
    (re.compile(rf"start_new_{TERM}="), "subprocess.Popen's keyword: the server runs in its own process group"),
]


def is_allowed_file(path: str) -> bool:
    return any(fnmatch.fnmatch(path, pattern) for pattern, _ in ALLOWED_FILES)


def word_hits(path: Path, name: str) -> list[str]:
    """Lines of one file that use the word outside the allowed patterns, as `name:line: text`."""
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return []  # binary (an image, weights)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return []
    hits = []
    for number, line in enumerate(text.splitlines(), 1):
        rest = line
        for pattern, _ in ALLOWED_LINES:
            rest = pattern.sub("", rest)
        if WORD.search(rest):
            hits.append(f"{name}:{number}: {line.strip()[:120]}")
    return hits


def tracked_files() -> list[str]:
    try:
        done = subprocess.run(["git", "ls-files", "-z", "--", *SCANNED], cwd=ROOT, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [name for name in done.stdout.decode().split("\0") if name and (ROOT / name).is_file()]


def scan(names: list[str], root: Path = ROOT) -> list[str]:
    """Every disallowed use of the word in these files (paths relative to root), names included."""
    found = []
    for name in names:
        if WORD.search(name) and not is_allowed_file(name):
            found.append(f"{name}: the file's name")
        if not is_allowed_file(name):
            found.extend(word_hits(root / name, name))
    return found


def test_no_tracked_file_mentions_the_word():
    hits = scan(tracked_files())
    assert not hits, "the project's files describe the project, not who worked when:\n" + "\n".join(hits)


def test_the_scanner_catches_an_added_use(tmp_path):
    (tmp_path / "docs").mkdir()
    upper = TERM.capitalize()
    (tmp_path / "docs" / "note.md").write_text(f"Measured in {upper} 12 on a quiet machine.\n")
    (tmp_path / "docs" / "ok.md").write_text(f'@pytest.fixture(scope="{TERM}")\nnothing else here\n')
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / f"bench-{TERM}7.json").write_text("{}\n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\0\0" + TERM.encode())
    hits = scan(["docs/note.md", "docs/ok.md", f"benchmarks/bench-{TERM}7.json", "image.png"], tmp_path)
    assert hits == [f"docs/note.md:1: Measured in {upper} 12 on a quiet machine.",
                    f"benchmarks/bench-{TERM}7.json: the file's name"]
    # A line that holds the allowed keyword and the word besides is still caught.
    line = f'@pytest.fixture(scope="{TERM}")  # as in {TERM} 3'
    (tmp_path / "docs" / "ok.md").write_text(line + "\n")
    assert scan(["docs/ok.md"], tmp_path) == [f"docs/ok.md:1: {line}"]
    assert scan(["specdec_cli/trained/x/tokenizer.json"], tmp_path) == []  # allowed file: never opened


def test_readme_is_short_and_links_every_doc():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    docs = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").glob("*.md"))
    assert {"docs/design.md", "docs/precision.md", "docs/performance.md", "docs/training.md", NOTEBOOK} <= set(docs)
    missing = [doc for doc in docs if doc != NOTEBOOK and f"]({doc}" not in readme]
    assert not missing, f"README.md does not link {missing}"
    assert f"]({NOTEBOOK}" not in readme, "the notebook is a record, not documentation"


def test_performance_page_stays_a_users_page():
    """Figures with their commands, no lab notebook: short, and no commit ids in its prose."""
    text = (ROOT / "docs/performance.md").read_text()
    assert len(text.splitlines()) <= 250
    assert not re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text)  # a commit id


def test_doc_links_to_repository_files_resolve():
    """A relative link in the README or a doc names a file or folder that exists."""
    broken = []
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), ROOT / "specdec_cli/trained/README.md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not broken, "\n".join(broken)


def user_pages() -> list[Path]:
    """The pages a user reads: the READMEs and every doc but the notebook."""
    docs = [path for path in sorted((ROOT / "docs").glob("*.md")) if path.relative_to(ROOT).as_posix() != NOTEBOOK]
    return [ROOT / "README.md", *docs, ROOT / "specdec_cli/trained/README.md", ROOT / "benchmarks/README.md"]


def test_cited_benchmark_files_exist():
    """Every `benchmarks/...` path the README and docs cite (globs included) names files that exist."""
    missing = []
    for page in user_pages():
        for cited in CITED.findall(page.read_text()):
            if not list(ROOT.glob(cited)) and not (ROOT / cited).exists():
                missing.append(f"{page.relative_to(ROOT)}: {cited}")
    assert not missing, "\n".join(missing)


def uncited_results(root: Path, cited: set[str]) -> list[str]:
    """Result files under benchmarks/ (results/, archive/, export/ less its scripts) that no cited path,
    glob or folder names."""
    found = []
    for folder in ("results", "archive", "export"):
        for path in sorted((root / "benchmarks" / folder).rglob("*")):
            name = path.relative_to(root).as_posix()
            if path.is_file() and path.suffix != ".py" and not any(
                    name == c or fnmatch.fnmatch(name, c) or name.startswith(c + "/") for c in cited):
                found.append(name)
    return found


def test_benchmarks_keep_only_cited_results():
    """A result file stays while a figure in a user's page cites it; git history keeps the rest."""
    cited = {c for page in user_pages() for c in CITED.findall(page.read_text())}
    stale = uncited_results(ROOT, cited)
    assert not stale, "no user page cites these (cite them or delete them):\n" + "\n".join(stale)


def test_the_result_check_catches_an_uncited_file(tmp_path):
    for name in ["results/a.json", "results/runs/1.json", "results/runs/2.json", "results/glob-1.json",
                 "archive/old.json", "export/tool.py", "export/gap.json"]:
        (tmp_path / "benchmarks" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "benchmarks" / name).write_text("{}\n")
    cited = {"benchmarks/results/a.json", "benchmarks/results/runs", "benchmarks/results/glob-*.json"}
    assert uncited_results(tmp_path, cited) == ["benchmarks/archive/old.json", "benchmarks/export/gap.json"]


def test_benchmarks_readme_describes_every_script_and_prompt_file():
    """benchmarks/README.md is a hand-written guide: it names every script and prompt file there."""
    guide = (ROOT / "benchmarks/README.md").read_text()
    bench = ROOT / "benchmarks"
    names = sorted(path.relative_to(bench).as_posix()
                   for pattern in ("*.py", "*.sh", "*.jsonl", "*.txt", "export/*.py") for path in bench.glob(pattern))
    assert "block_costs.py" in names and "unseen-prompts.jsonl" in names
    missing = [name for name in names if f"`{name}`" not in guide]
    assert not missing, f"benchmarks/README.md does not describe {missing}"


def test_version_prints_the_projects_version_without_loading_torch():
    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    code = ("import sys\nfrom specdec_cli.cli import main\ntry:\n    main()\nexcept SystemExit as exc:\n"
            "    assert 'torch' not in sys.modules, 'torch loaded'\n    raise\n")
    done = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"specdec {expected}\n"


def test_the_declared_floors_are_the_versions_installed_and_tested():
    """pyproject's torch floor is the torch install.sh pins, and its Python floor is one this run meets:
    a floor below what was ever tested promises what nobody checked."""
    import re
    import sys

    from packaging.specifiers import SpecifierSet

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    torch_floor = next(d for d in project["dependencies"] if d.startswith("torch"))
    pinned = re.search(r"torch==([0-9.]+)", (ROOT / "install.sh").read_text()).group(1)
    assert torch_floor == f"torch>={pinned}"
    python = ".".join(map(str, sys.version_info[:3]))
    floor = project["requires-python"]
    assert python in SpecifierSet(floor) and floor == ">=3.11"  # tomllib, which the tests import, is 3.11's
