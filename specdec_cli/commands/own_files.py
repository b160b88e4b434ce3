"""What specdec writes at each output path, recognised cheaply: atomic.check_writable replaces an
existing, non-empty file (or fills a non-empty directory) only when the recogniser its command names
here says specdec wrote it there. A notes file, a JSON config or a model directory handed to an output
option by mistake is refused before any work, and left as it was.

Each recogniser looks at content, never at the name, reads a bounded amount, and loads no model: the
first bytes of a page or an image, the keys of a JSON object, the marker files of a directory. A file
past the bound is not read to find out, and so is not ours.
"""

from __future__ import annotations

from pathlib import Path

from ..atomic import read_at_most
from ..errors import loads
from ..pairs.meta import EXPORT_FILE, META_FILE

MAX_READ = 64 * 1024 * 1024  # bytes: far above any report, profile or config specdec writes
HEAD_BYTES = 4096  # bytes: enough for a page's title or an image's signature


def _bytes(path: Path, limit: int = MAX_READ) -> bytes | None:
    """The file's bytes; None when it has more than ``limit`` (a whole-file reader cannot judge it)."""
    return read_at_most(path, limit)[0]


def _head(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(HEAD_BYTES)


def _json_object(path: Path) -> dict | None:
    data = _bytes(path)
    try:
        value = loads(data.decode("utf-8"), max_chars=None) if data is not None else None
    except ValueError:  # not JSON (UnicodeDecodeError is one), or nested past the parser's bound
        return None
    return value if isinstance(value, dict) else None


# --- files ---------------------------------------------------------------------------------------


def verify_report(path: Path) -> bool:
    """verify-equivalence --report, this loop's or a serving engine's: a JSON object with its verdict."""
    report = _json_object(path)
    return report is not None and {"pair", "equivalent", "verdict"} <= report.keys()


# export --out's JSON, by engine (export/engines.py: vllm_config, sglang_adaptive, generation_config)
ENGINE_CONFIG_KEYS = (
    {"method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max",
     "num_speculative_tokens_per_batch_size"},
    {"candidate_steps"},
    {"do_sample", "prompt_lookup_num_tokens", "max_matching_ngram_size", "num_assistant_tokens",
     "num_assistant_tokens_schedule", "assistant_confidence_threshold"},
)
ENGINE_COMMANDS = ("llama-server ", "python -m sglang.launch_server ")  # export --out's command lines
COMMAND_LINE = 64 * 1024  # bytes: the longest command line export writes, with room to spare


def engine_config(path: Path) -> bool:
    """export --out, for whichever engine wrote it: a JSON object of one engine's keys alone (a model's
    own generation_config.json has others, and stays), or one llama-server / SGLang command line."""
    if _head(path).lstrip().startswith(b"{"):
        config = _json_object(path)
        return config is not None and any(config.keys() <= keys for keys in ENGINE_CONFIG_KEYS)
    data = _bytes(path, COMMAND_LINE)
    line = data.decode("utf-8").rstrip("\n") if data is not None else ""
    return "\n" not in line and line.startswith(ENGINE_COMMANDS)


BENCH_TITLE, ENGINE_BENCH_TITLE = "# Benchmark", "# Engine benchmark"  # the pages bench --markdown writes


def markdown_page(path: Path) -> bool:
    """bench --markdown, this loop's or an engine's: its title, then the line naming the command."""
    lines = _head(path).decode("utf-8", errors="replace").splitlines()
    return len(lines) > 2 and lines[0] in (BENCH_TITLE, ENGINE_BENCH_TITLE) and lines[2].startswith("Made with `specdec ")


IMAGE_SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"%PDF-", b"%!PS", b"\xff\xd8\xff", b"II*\x00", b"MM\x00*")


def image(path: Path) -> bool:
    """--plot: an image in a format matplotlib writes (the name's suffix picks it; PNG without one)."""
    head = _head(path)
    if head.startswith(IMAGE_SIGNATURES) or (head.startswith(b"RIFF") and head[8:12] == b"WEBP"):
        return True
    return head.lstrip().startswith((b"<?xml", b"<svg")) and b"<svg" in head


def profile(path: Path) -> bool:
    """calibrate-k --write's profile: YAML with a top-level ``pairs:`` section. Whether its sections
    are sound is read_profiles' to say, whose line names what is wrong in a damaged one."""
    data = _bytes(path)
    return data is not None and any(line.startswith(b"pairs:") for line in data.splitlines())


# --- directories ---------------------------------------------------------------------------------


def training_run(directory: Path) -> bool:
    """train-draft --out: a finished run's metadata, or an unfinished one's checkpoint (data, state)."""
    checkpoint = directory / "checkpoint"
    return (directory / META_FILE).is_file() or (
        checkpoint.is_dir() and any(entry.name.startswith(("data.", "state.")) for entry in checkpoint.iterdir()))


def eagle3_export(directory: Path) -> bool:
    """export-head --out: a directory an earlier export wrote (never a model directory of the user's)."""
    return (directory / EXPORT_FILE).is_file()
