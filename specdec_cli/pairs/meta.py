"""The metadata file written next to every trained drafter (a head or a draft model), as plain JSON.

Kept apart from head.py, which needs torch and transformers, so that reading models.yaml (which
asks whether a directory is a head) stays light.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError

META_FILE = "specdec-draft.json"  # written next to every trained drafter, both kinds


def read_meta(directory: str | Path) -> dict | None:
    path = Path(directory) / META_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc.msg})") from None


def write_meta(directory: str | Path, meta: dict) -> None:
    """Indented for reading, except the (long) list of output-layer ids, kept on one line."""
    text = json.dumps({**meta, "top_vocab": None}, indent=1)
    text = text.replace('"top_vocab": null', '"top_vocab": ' + json.dumps(meta.get("top_vocab")), 1)
    (Path(directory) / META_FILE).write_text(text + "\n")
