"""The metadata file written next to every trained drafter (a head or a draft model), as plain JSON.

Kept apart from head_files.py, which needs torch and transformers, so that reading models.yaml (which
asks whether a directory is a head) stays light.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError, json_type

META_FILE = "specdec-draft.json"  # written next to every trained drafter, both kinds
EXPORT_FILE = "specdec-export.json"  # an exported head's provenance, beside its weights (export/eagle3.py)
MODEL_CONFIG = "config.json"  # a draft model's (transformers'); a head has none


def read_meta(directory: str | Path) -> dict | None:
    """The drafter's metadata, None where there is none; a file that is no JSON object is one line
    naming it (a write cut short, a hand edit), not a traceback wherever it is first read."""
    path = Path(directory) / META_FILE
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise damaged(path, exc.strerror or str(exc)) from None
    except UnicodeDecodeError:
        raise damaged(path, "not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise damaged(path, f"not valid JSON ({exc.msg})") from None
    if not isinstance(meta, dict):
        raise damaged(path, f"a JSON {json_type(meta)}, not an object")
    return meta


def damaged(path: Path, problem: str) -> UserError:
    """A trained drafter's file that cannot be used as it is: training again writes it anew."""
    kind = "draft model" if (Path(path).parent / MODEL_CONFIG).is_file() else "head"
    return UserError(f"{path}: {problem}; train it again or point at another {kind}")


def write_meta(directory: str | Path, meta: dict) -> None:
    """Indented for reading, except the (long) list of output-layer ids, kept on one line."""
    text = json.dumps({**meta, "top_vocab": None}, indent=1)
    text = text.replace('"top_vocab": null', '"top_vocab": ' + json.dumps(meta.get("top_vocab")), 1)
    (Path(directory) / META_FILE).write_text(text + "\n")
