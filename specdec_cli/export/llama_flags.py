"""llama-server's draft flag names: its 2026 builds renamed them (``--draft-max`` became
``--spec-draft-n-max`` and the old ones were removed), so a binary's ``--help`` decides (the one
``bash install.sh llama.cpp`` built, else one on PATH), and without one the documented current
names are used and the export says so."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

CURRENT = dict(model_draft="--spec-draft-model", n_max="--spec-draft-n-max", n_min="--spec-draft-n-min",
               p_min="--spec-draft-p-min", spec_type="--spec-type")
LEGACY = dict(model_draft="--model-draft", n_max="--draft-max", n_min="--draft-min", p_min="--draft-p-min",
              spec_type="--spec-type")


@dataclass(frozen=True)
class LlamaFlags:
    model_draft: str
    n_max: str
    n_min: str
    p_min: str
    spec_type: str
    current: bool
    source: str  # one line for the export: where these names came from
    ngram_length: bool = True  # the build sets the default ngram type's own draft length (--spec-ngram-mod-n-max)

    @classmethod
    def documented(cls, why: str = "no llama-server built (bash install.sh llama.cpp) or on PATH") -> "LlamaFlags":
        return cls(**CURRENT, current=True,
                   source=f"llama-server flag names: the documented 2026 ones ({why}; older builds call them "
                          "--model-draft/--draft-max/--draft-min/--draft-p-min)")


def from_help(text: str, binary: str) -> LlamaFlags:
    """The names a build's --help lists: the current ones if it knows --spec-draft-n-max, else legacy."""
    if "--spec-draft-n-max" in text:
        names = dict(CURRENT)
        if "--spec-draft-model" not in text:  # early 2026 builds kept -md/--model-draft
            names["model_draft"] = "--model-draft"
        return LlamaFlags(**names, current=True, source=f"llama-server flag names from {binary} --help (current names)",
                          ngram_length="--spec-ngram-mod-n-max" in text)
    if "--draft-max" in text:
        spec_type = "--spec-type" if "--spec-type" in text else ""
        return LlamaFlags(**{**LEGACY, "spec_type": spec_type}, current=False,
                          source=f"llama-server flag names from {binary} --help (legacy names)", ngram_length=False)
    return LlamaFlags.documented(f"{binary} --help lists no draft flags")


def probe() -> LlamaFlags:
    from ..errors import UserError
    from ..serving.environment import llama_server

    try:
        path = str(llama_server())
    except UserError:
        path = shutil.which("llama-server")
    if path is None:
        return LlamaFlags.documented()
    try:
        done = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return LlamaFlags.documented(f"{path} --help failed: {exc}")
    return from_help(done.stdout + done.stderr, path)
