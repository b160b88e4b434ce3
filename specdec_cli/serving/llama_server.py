"""llama.cpp's server as specdec starts it: the pair's GGUF as it is (the weights specdec's own loop
decodes), a mode's speculative flags, and the pair's draft model or EAGLE-3 head converted to GGUF
once, with the converter of the same llama.cpp sources.

The flags are this build's (``llama-server --help``; they were renamed in 2026). Every server gets
``--metrics`` (the counters `bench`, `verify-equivalence` and `watch` read), no web UI and no host
prompt cache, and as many slots as the highest concurrency asked of it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import UserError
from . import environment

CONTEXT = 2048  # tokens per slot, as the vLLM servers' --max-model-len
CONVERT_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class LlamaConfig:
    """One llama-server: the target GGUF and the mode's speculative flags (none for plain)."""

    label: str  # the mode it serves: llama-plain, llama-ngram:4, ...
    gguf: Path
    served_name: str
    speculative: tuple[str, ...] = ()
    threads: int | None = None
    parallel: int = 1  # slots: requests decoded together
    port: int | None = None

    engine = "llama.cpp"
    dialect = "llama.cpp"

    def arguments(self, port: int) -> list[str]:
        threads = str(self.threads or os.cpu_count() or 1)
        return ["-m", str(self.gguf), "--alias", self.served_name, "--host", "127.0.0.1", "--port", str(port),
                "-t", threads, "-tb", threads, "-np", str(self.parallel), "-c", str(CONTEXT * self.parallel),
                "--metrics", "--no-webui", "--cache-ram", "0", *self.speculative]

    def command(self, port: int) -> list[str]:
        return [str(environment.llama_server()), *self.arguments(port)]

    def environment(self) -> dict[str, str]:
        return environment.llama_environment()


def speculative_flags(method: str | None, k: int, draft: Path | None = None) -> tuple[str, ...]:
    """A mode's flags, K drafted tokens at most. Each ngram type has its own length flag and ignores
    --spec-draft-n-max (which only a draft model and ngram-cache read): ngram-simple's draft m-gram,
    ngram-map-k's, ngram-mod's n-max (its n-min 1: whatever it finds, as specdec's lookup). A draft
    model or head (``draft``: its GGUF) keeps every draft (p-min 0), as specdec's chain of K."""
    if method is None:
        return ()
    length = {"ngram-simple": ("--spec-ngram-simple-size-m", str(k)), "ngram-map-k": ("--spec-ngram-map-k-size-m", str(k)),
              "ngram-mod": ("--spec-ngram-mod-n-max", str(k), "--spec-ngram-mod-n-min", "1")}
    flags = ("--spec-type", method, *length.get(method, ("--spec-draft-n-max", str(k))))
    if draft is not None:
        flags += ("--spec-draft-model", str(draft), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0")
    return flags


def draft_gguf(model_dir: Path, progress: Callable[[str], None] = lambda line: None) -> Path:
    """The draft model as GGUF (f16), converted once into the cache with llama.cpp's own converter,
    keyed by its weights and config: a retrained draft gets a new file instead of a stale one."""
    return converted(model_dir, (), "the draft model", progress)


def eagle3_gguf(eagle3_dir: Path, target_dir: Path, progress: Callable[[str], None] = lambda line: None) -> Path:
    """An EAGLE-3 head (export-head --engine llama.cpp's layout) as GGUF: the converter reads the
    target's config and tokenizer from ``target_dir`` and writes d2t as absolute target ids."""
    return converted(eagle3_dir, ("--target-model-dir", str(target_dir)), "the EAGLE-3 head", progress)


def converted(model_dir: Path, extra: tuple[str, ...], what: str, progress: Callable[[str], None]) -> Path:
    """``model_dir`` converted to f16 GGUF once, into ``<cache>/llama-drafts/``, keyed by its
    files and the extra arguments; written aside and renamed, so a reader finds all of it or none."""
    from ..pairs.cache_dir import cache_root

    digest = hashlib.sha256(" ".join(extra).encode())
    for path in sorted(model_dir.glob("*.json")) + sorted(model_dir.glob("*.safetensors")):
        digest.update(path.name.encode() + path.read_bytes())
    final = cache_root() / "llama-drafts" / f"{model_dir.name}-{digest.hexdigest()[:16]}.gguf"
    if final.is_file():
        return final
    source = environment.llama_source()
    final.parent.mkdir(parents=True, exist_ok=True)
    progress(f"converting {what} {model_dir} to GGUF at {final} (once)")
    with tempfile.TemporaryDirectory(dir=final.parent) as scratch:
        partial = Path(scratch) / final.name
        env = dict(os.environ, PYTHONPATH=str(source / "gguf-py"), HF_HUB_OFFLINE="1")
        done = subprocess.run([sys.executable, str(source / "convert_hf_to_gguf.py"), str(model_dir), *extra,
                               "--outfile", str(partial), "--outtype", "f16"], capture_output=True, text=True, env=env,
                              timeout=CONVERT_TIMEOUT_S, stdin=subprocess.DEVNULL)
        if done.returncode != 0 or not partial.is_file():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
            raise UserError(f"llama.cpp's converter could not make {model_dir} GGUF: {last}")
        partial.replace(final)
    return final
