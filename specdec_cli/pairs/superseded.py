"""Cache entries that a newer copy of the same GGUF file has replaced.

A GGUF source's conversion (and the prepared target made from it) is keyed by the file's size and
modification time, so that a changed file is converted again. Reinstalling the model's package gives
the same file a new time: a new conversion (~0.5 GB for the default pair) and a new prepared target
(~0.6 GB), while the old ones would stay forever. So each conversion records which file it came
from (``MARK``), and once a newer conversion of that file exists, the older ones and the prepared
targets made from them are removed. A conversion without the mark (written before it existed, or by
hand) is left alone.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from ..runtime import prepared_file

MARK = "specdec-source.json"


def mark(directory: Path, source: str) -> None:
    """Record in a conversion's ``directory`` the GGUF file it was converted from."""
    (directory / MARK).write_text(json.dumps({"gguf": source}) + "\n")


def source_of(directory: Path) -> str | None:
    try:
        return json.loads((directory / MARK).read_text()).get("gguf")
    except (OSError, ValueError, AttributeError):
        return None


def prepared_name(directory_name: str) -> str:
    """The name part of the prepared targets made from a conversion (pairs/loading.py names them)."""
    return re.sub(r"[^A-Za-z0-9._]+", "_", directory_name)[:48]


def remove_superseded(cache: Path, kept: Path, source: str) -> list[Path]:
    """Remove the conversions in ``cache`` of the same ``source`` as ``kept`` but for an older copy
    of it, with their prepared targets; the removed conversions, for the caller to report."""
    stem = kept.name.rsplit("-", 1)[0]
    removed = []
    for other in sorted(cache.glob(f"{stem}-*")):
        if other == kept or not other.is_dir() or source_of(other) != source:
            continue
        if prepared_name(other.name) != prepared_name(kept.name):  # a name cut short could match the kept ones
            for path in prepared_file.files(cache, f"prepared-{prepared_name(other.name)}-"):
                path.unlink(missing_ok=True)
        shutil.rmtree(other, ignore_errors=True)
        removed.append(other)
    return removed
