"""Writing a file so that a reader sees the old content or the new, never half of it, and checking
before the work starts that it can be written at all.

One rule for every output path (--report, --profile, --markdown, --plot, train-draft --out): missing
parent directories are created when the file is written, so the nearest existing one must be a
directory this process can write in; an existing directory is never taken for a file name.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import UserError


def check_writable(path: str | Path, option: str, directory: bool = False) -> Path:
    """Refuse now, before any model loads, an output path that could not be written at the end."""
    path = Path(path).expanduser()
    if not directory and path.is_dir():
        raise UserError(f"{option} {path}: is a directory; give a file name")
    if directory and path.exists() and not path.is_dir():
        raise UserError(f"{option} {path}: exists and is not a directory")
    existing = path if directory and path.is_dir() else path.parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{option} {path}: {existing} is not a directory")
    try:  # os.access says yes to root everywhere, even in /proc: only a real file tells
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".specdec-probe-"):
            pass
    except OSError as exc:
        raise UserError(f"{option} {path}: cannot write in {existing}: {exc.strerror or exc}") from None
    return path


def write_atomically(path: Path, text: str) -> None:
    """A temp file in the same directory, flushed to disk, then os.replace over the target.

    The temp file is private (0600); the result keeps the old file's mode, or the usual one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.is_file() else 0o666 & ~_umask()
    handle = tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False)
    try:
        with handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(handle.name, mode)
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
