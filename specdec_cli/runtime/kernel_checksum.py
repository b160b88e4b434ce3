"""The record of a kernel library as it was built: its size and sha256 in a file beside it, and
what the compiler said (its warnings under -Wall: none, on the compilers tested).

dlopen maps a library's segments as its headers describe them: a library truncated after it was
built faults (SIGBUS) the first time a missing page is touched, with no message. The library is
checked against this record before it is loaded, so a damaged file is built again and never handed
to dlopen. The library is small, so hashing it costs little beside loading it.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from . import staging


def record_path(library: Path) -> Path:
    """The record beside ``library``: ``specdec_kernels-<digest>.sha256``."""
    return library.with_suffix(".sha256")


def measured(library: Path) -> dict:
    """The library's size and sha256, as the record holds them."""
    data = library.read_bytes()
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write(library: Path, diagnostics: str = "") -> None:
    """Record ``library`` as it is now, and what the compiler said building it, atomically and after
    it: a build killed before this leaves a library without a valid record, which is built again."""
    record = record_path(library)
    with staging.staging(record.parent) as directory:  # removed by a later run if this one is killed
        (directory / record.name).write_text(json.dumps({**measured(library), "diagnostics": diagnostics}))
        os.replace(directory / record.name, record)


def damage(library: Path) -> str | None:
    """Why the existing ``library`` is not the one its record describes (None when it is)."""
    record = record_path(library)
    try:
        expected = json.loads(record.read_text())
        size, sha256 = expected["size"], expected["sha256"]
    except (OSError, ValueError, TypeError, KeyError):  # a missing record is native_kernels.load's to tell apart
        return f"{record.name} is unreadable"
    try:
        actual = measured(library)
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    if actual["size"] != size:
        return f"{actual['size']} bytes, not the {size} it was built with"
    if actual["sha256"] != sha256:
        return "its sha256 is not the one it was built with"
    return None
