"""Where specdec writes a cache entry before it is whole (a GGUF conversion, a prepared target, the
compiled kernels), and the removal of what a killed writer left there.

A writer makes a ``.staging-XXXX/`` directory next to the entry, holds an exclusive ``flock`` on it
while it writes inside, and moves the finished entry out with ``os.replace``. The kernel drops the
lock when the writer's process ends, however it ends (SIGKILL included), so a staging directory
whose lock can be taken has no writer left, and ``sweep`` removes it. A lock rather than a pid in
the name: pids are reused, and a cache shared between containers sees pids of other namespaces.
A directory rather than the staging file itself: the linker replaces its output file (a lock on the
old inode would guard nothing), and a conversion is a directory anyway.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path

PREFIX = ".staging-"
# What earlier versions staged, without a lock: removed once older than any write takes.
LEGACY = (".converting-*", ".*.pt.*", ".specdec_kernels-*.so.*")
LEGACY_AGE_S = 3600


@contextmanager
def staging(directory: Path) -> Iterator[Path]:
    """A fresh staging directory in ``directory``, locked while the block runs; what is left in it
    afterwards is removed. OSError when ``directory`` cannot be written."""
    directory.mkdir(parents=True, exist_ok=True)
    path, handle = _locked(directory)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(handle)


def sweep(directory: Path) -> list[Path]:
    """Remove the staging directories in ``directory`` whose writer is gone (one listing; entries it
    cannot remove, in a read-only cache, stay); the removed paths."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    removed = []
    for entry in entries:
        if not entry.name.startswith("."):  # every staging name is hidden; the cache's entries are not
            continue
        path = Path(entry.path)
        remove = _gone if entry.name.startswith(PREFIX) else _legacy
        if remove(path):
            removed.append(path)
    return removed


def _locked(directory: Path) -> tuple[Path, int]:
    """mkdtemp, then lock it; made again if a sweep took it between the two (its lock came first)."""
    while True:
        path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=directory))
        handle = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:  # a file system without locks: a sweep cannot take it either, so it is never removed
            pass
        if _same(path, handle):
            return path, handle
        os.close(handle)


def _same(path: Path, handle: int) -> bool:
    try:
        found, held = os.stat(path), os.fstat(handle)
    except OSError:
        return False
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def _legacy(path: Path) -> bool:
    """Remove an earlier version's staging file or directory once it is older than any write takes."""
    return any(fnmatch(path.name, pattern) for pattern in LEGACY) and _old(path) and _remove(path)


def _gone(path: Path) -> bool:
    """Remove ``path`` if its lock can be taken now (its writer is gone), holding the lock meanwhile."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return _remove(path)
    except OSError:  # BlockingIOError: a writer holds it
        return False
    finally:
        os.close(handle)


def _old(path: Path) -> bool:
    try:
        return time.time() - path.lstat().st_mtime > LEGACY_AGE_S
    except OSError:
        return False


def _remove(path: Path) -> bool:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except OSError:
        return False
    return True
