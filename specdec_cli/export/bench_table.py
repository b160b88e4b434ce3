"""The per-batch-size K table an engine bench implies: at each measured concurrency the K of the
fastest mode (0 where plain wins), as vLLM's ``num_speculative_tokens_per_batch_size``.

An engine bench (`specdec bench --engine vllm --concurrency ...`) measures the engine's own costs
under load, which specdec's batch-1 loop cannot: where speculation stops paying is a property of
the engine and the hardware. Levels become inclusive ranges: level i covers batch sizes from its
concurrency up to one below the next level's, the last one up to ``LAST_BATCH``; neighbours with
the same K merge.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError, read_json

LAST_BATCH = 256  # vLLM's default --max-num-seqs: the last range reaches it
PLAIN = "plain"
MODE_K = re.compile(r"^(?:vllm-|llama-)?(?P<method>[a-z0-9_]+):(?P<k>\d+)$")  # llama-ngram-mod:K is not ngram


@dataclass(frozen=True)
class Level:
    """One concurrency level: output tokens per second by K (0 is plain) for one drafting method."""

    concurrency: int
    speed: dict[int, float]

    @property
    def best_k(self) -> int:
        """The fastest K at this level; plain (0) when it ties."""
        return max(self.speed, key=lambda k: (self.speed[k], -k))

    @property
    def gain(self) -> float:
        plain = self.speed.get(0)
        return self.speed[self.best_k] / plain if plain else float("nan")


def mode_k(mode: str) -> tuple[str, int] | None:
    """'vllm-ngram:4' (or 'llama-ngram:4') → ('ngram', 4), 'vllm-plain' → ('plain', 0); None for anything else."""
    name = re.sub(r"^(vllm|llama)-", "", mode)
    if name == PLAIN:
        return PLAIN, 0
    match = MODE_K.match(mode)
    return (match["method"], int(match["k"])) if match else None


def table(levels: list[Level], last_batch: int = LAST_BATCH) -> list[list[int]]:
    """[[first_bs, last_bs, K], ...], inclusive, merged where neighbouring levels pick the same K."""
    ordered = sorted(levels, key=lambda level: level.concurrency)
    rows: list[list[int]] = []
    for i, level in enumerate(ordered):
        first = 1 if i == 0 else level.concurrency
        last = ordered[i + 1].concurrency - 1 if i + 1 < len(ordered) else max(last_batch, level.concurrency)
        k = level.best_k
        if rows and rows[-1][2] == k:
            rows[-1][1] = last
        else:
            rows.append([first, last, k])
    return rows


def read_bench(path: Path) -> dict:
    """An engine bench's JSON (`specdec bench --engine vllm --json`), read once for its levels and
    its servers' arguments."""
    data = read_json(path, "--from-bench")
    return data if isinstance(data, dict) else {}


def levels(data: dict, method: str, path: Path) -> list[Level]:
    """The levels of an engine bench (``read_bench``) for one drafting method (vLLM's name: ngram,
    draft_model, eagle3) beside plain, from its ``modes: {MODE: {LEVEL: {output_tok_s}}}``."""
    by_level: dict[int, dict[int, float]] = {}
    for concurrency, mode, speed in _rows(data):
        parsed = mode_k(mode)
        if parsed is None or parsed[0] not in (PLAIN, *_aliases(method)):
            continue
        by_level.setdefault(concurrency, {})[parsed[1]] = speed
    found = [Level(c, speeds) for c, speeds in sorted(by_level.items()) if 0 in speeds and len(speeds) > 1]
    if not found:
        raise UserError(f"--from-bench {path}: no concurrency level with both the engine's plain mode and a {method} mode "
                        "(run `specdec bench --engine vllm --concurrency 1,2,4,... --modes vllm-plain,...`, or "
                        "--engine llama.cpp with llama-plain,...)")
    return found


def lookup_bounds(data: dict, k: int) -> tuple[int, int] | None:
    """The prompt-lookup bounds the bench's ngram server for K ``k`` ran with (its manifest keeps every
    server's arguments; another ngram server's where none drafted K ``k``), so that an export from it
    configures what was measured; None when the bench does not say."""
    servers = ((data.get("manifest") or {}).get("engine") or {}).get("servers") or {}
    found = {}
    for mode, server in servers.items():
        parsed = mode_k(mode)
        config = _speculative_config((server or {}).get("arguments") or [])
        if parsed and config.get("method") == "ngram" and {"prompt_lookup_min", "prompt_lookup_max"} <= set(config):
            found[parsed[1]] = int(config["prompt_lookup_min"]), int(config["prompt_lookup_max"])
    return found.get(k) or (found[min(found)] if found else None)


def _speculative_config(arguments: list) -> dict:
    if "--speculative-config" not in arguments[:-1]:
        return {}
    try:
        config = json.loads(arguments[arguments.index("--speculative-config") + 1])
    except (json.JSONDecodeError, TypeError):
        return {}
    return config if isinstance(config, dict) else {}


def _aliases(method: str) -> tuple[str, ...]:
    """The bench's mode names for a vLLM method (vllm-draft:K is draft_model)."""
    return {"draft_model": ("draft", "draft_model"), "eagle3": ("eagle3", "eagle", "head")}.get(method, (method,))


def _rows(data) -> list[tuple[int, str, float]]:
    """(concurrency, mode, output tok/s) from `specdec bench --engine vllm --json`'s ``modes``."""
    rows = []
    modes = data.get("modes") if isinstance(data, dict) else None
    for mode, by_level in (modes if isinstance(modes, dict) else {}).items():
        for concurrency, figures in (by_level or {}).items():
            speed = _speed(figures) if isinstance(figures, dict) else None
            if speed is not None:
                rows.append((int(float(concurrency)), str(mode), speed))
    return rows


def _speed(figures: dict) -> float | None:
    for key in ("output_tok_s", "output_throughput", "tokens_per_s"):
        value = figures.get(key)
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    return None
