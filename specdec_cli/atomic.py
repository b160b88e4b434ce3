"""Writing a file so that a reader sees the old content or the new, never half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str) -> None:
    """A temp file in the same directory, flushed to disk, then os.replace over the target.

    The temp file is private (0600); the result keeps the old file's mode, or the usual one.
    """
    path = Path(path)
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
