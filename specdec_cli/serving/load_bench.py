"""The load bench of `specdec bench --engine vllm|llama.cpp`: modes, the schedule that interleaves
them level by level and repeat by repeat (so drift on a shared machine falls on every mode alike),
and the report: figures per mode and level, the gain over plain with its interval, the crossover
concurrency, and the per-batch-size K table the curve implies."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import UserError
from ..limits import MAX_K
from . import metrics, stats
from .client import Endpoint, complete
from .load import LevelRun, Request, ServerDied, level_figures, requests_for_level, run_level

PLAIN = "vllm-plain"
METHODS = {"ngram": "ngram", "draft": "draft_model", "eagle3": "eagle3"}  # mode prefix → vLLM's method
CONFIG = "vllm-config"  # vllm-config:FILE, a server started with the --speculative-config JSON in FILE
LLAMA_PLAIN = "llama-plain"
# llama-server's --spec-type per mode prefix. llama-ngram:K is ngram-mod, the type that drafted best
# on the unseen prompts (docs/llama-cpp.md has every type's figures).
DEFAULT_LLAMA_NGRAM = "ngram-mod"
LLAMA_TYPES = {"ngram": DEFAULT_LLAMA_NGRAM, "ngram-simple": "ngram-simple", "ngram-map-k": "ngram-map-k",
               "ngram-mod": "ngram-mod", "ngram-cache": "ngram-cache", "draft": "draft-simple",
               "eagle3": "draft-eagle3"}


@dataclass(frozen=True)
class EngineMode:
    name: str  # as written: vllm-plain, vllm-ngram:4, vllm-config:spec.json, llama-plain, llama-ngram:4, ...
    method: str  # plain; vLLM's speculative method or "config" (the JSON in ``config``); llama-server's --spec-type
    k: int = 0
    config: Path | None = None
    engine: str = "vllm"

    @property
    def family(self) -> str:
        return self.name.split(":")[0]


def mode_prefix(engine: str) -> str:
    """How an engine's mode names start: vllm-, llama-."""
    return "llama-" if engine == "llama.cpp" else "vllm-"


def plain_mode(engine: str) -> str:
    """The mode every other one's gain is measured against."""
    return mode_prefix(engine) + "plain"


def mode_names(engine: str) -> str:
    """The modes an engine takes, for an error or --help."""
    if engine == "llama.cpp":
        return (f"{LLAMA_PLAIN}, llama-ngram:K ({DEFAULT_LLAMA_NGRAM}), llama-ngram-simple:K, llama-ngram-map-k:K, "
                f"llama-ngram-mod:K, llama-ngram-cache:K, llama-draft:K and llama-eagle3:K (K from 1 to {MAX_K})")
    return f"{PLAIN}, vllm-ngram:K, vllm-draft:K, vllm-eagle3:K (K from 1 to {MAX_K}) and {CONFIG}:FILE"


def parse_modes(text: str, engine: str = "vllm") -> list[EngineMode]:
    """'vllm-plain,vllm-ngram:4,vllm-draft:3' (or llama.cpp's 'llama-ngram:4,...') → modes; the
    engine's plain mode is added first when missing (the gain needs it)."""
    plain = plain_mode(engine)
    modes = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        if part == plain:
            modes.append(EngineMode(plain, "plain", engine=engine))
            continue
        if engine == "vllm" and part.startswith(CONFIG + ":"):
            path = Path(part.partition(":")[2])
            if not path.is_file():
                raise UserError(f"--modes {part}: no such file {path} (write one with `specdec export --engine vllm --out FILE`)")
            modes.append(EngineMode(part, "config", config=path))
            continue
        prefix, _, k = part.partition(":")
        family = mode_prefix(engine)
        known = LLAMA_TYPES if engine == "llama.cpp" else METHODS
        method = known.get(prefix.removeprefix(family)) if prefix.startswith(family) else None
        if method is None or not k.isdigit() or not 1 <= int(k) <= MAX_K:
            raise UserError(f"--modes: unknown {engine} mode {part!r}; {engine} modes are {mode_names(engine)}")
        modes.append(EngineMode(part, method, int(k), engine=engine))
    if not modes:
        raise UserError("--modes: give at least one engine mode")
    if plain not in [m.name for m in modes]:
        modes.insert(0, EngineMode(plain, "plain", engine=engine))
    return list({m.name: m for m in modes}.values())


def parse_levels(text: str, option: str = "--concurrency") -> list[int]:
    try:
        levels = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise UserError(f"{option} {text!r}: expected comma-separated positive integers") from None
    if not levels or levels[0] < 1:
        raise UserError(f"{option} {text!r}: expected comma-separated positive integers")
    return levels


def parse_slos(text: str | None) -> dict[str, float]:
    """'ttft:500,tpot:50' → {'ttft': 500.0, 'tpot': 50.0} (milliseconds)."""
    if not text:
        return {}
    slos = {}
    for part in text.split(","):
        name, _, value = part.partition(":")
        try:
            if name not in ("ttft", "tpot", "e2el") or not 0 < float(value) < float("inf"):  # nan fails too
                raise ValueError
        except ValueError:
            raise UserError(f"--slo {text!r}: expected ttft:MS, tpot:MS and/or e2el:MS, comma-separated") from None
        slos[name] = float(value)
    return slos


@dataclass
class Target:
    """A server under test: how to reach it and how to tell whether it still runs."""

    endpoint: Endpoint
    alive: Callable[[], bool] = lambda: True
    died: Callable[[], str | None] = lambda: None


class BenchInterrupted(Exception):
    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


def warm_up(target: Target, request: Request) -> None:
    complete(target.endpoint, request.prompt_ids, 4, ignore_eos=True, timeout_s=60.0)


def run(targets: dict[str, Target], prompts: list[Request], levels: list[int], *, max_tokens: int, repeats: int = 1,
        rate: bool = False, slos: dict[str, float] | None = None, count: int | None = None,
        progress: Callable[[str], None] = lambda line: None) -> dict:
    """Every level for every mode, repeat by repeat (the modes' order flips every repeat); a dead
    server stops the run with the levels finished so far in BenchInterrupted.report."""
    runs: dict[str, dict[int, list[LevelRun]]] = {mode: {} for mode in targets}
    for mode, target in targets.items():
        warm_up(target, prompts[0])
    for repeat in range(repeats):
        for level in levels:
            order = list(targets.items())
            for mode, target in order[::-1] if repeat % 2 else order:  # neither mode always goes first
                progress(f"{mode}: {'rate' if rate else 'concurrency'} {level}, repeat {repeat + 1} of {repeats}")
                requests = requests_for_level(prompts, 1 if rate else level, count)
                try:
                    done = run_level(target.endpoint, requests, max_tokens, concurrency=None if rate else level,
                                     rate=level if rate else None, seed=repeat, alive=target.alive)
                except ServerDied as exc:
                    raise BenchInterrupted(target.died() or f"{mode}: {exc}", report(runs, levels, slos)) from None
                runs[mode].setdefault(level, []).append(done)
    return report(runs, levels, slos)


def _merged(level_runs: list[LevelRun]) -> LevelRun:
    merged = LevelRun(duration_s=sum(r.duration_s for r in level_runs))
    window = metrics.Snapshot({}, 0.0)
    for r in level_runs:
        merged.completions += r.completions
        for key, value in (r.window.samples.items() if r.window else ()):
            window.samples[key] = window.samples.get(key, 0.0) + value
    merged.window = window
    return merged


def report(runs: dict[str, dict[int, list[LevelRun]]], levels: list[int], slos: dict[str, float] | None) -> dict:
    """Figures per mode and level (repeats pooled; throughput per repeat kept for the interval), the
    gain of each speculative mode per level, its crossover, and the K table per method."""
    modes: dict[str, dict] = {}
    for mode, by_level in runs.items():
        modes[mode] = {}
        for level, level_runs in by_level.items():
            figures = level_figures(_merged(level_runs), slos)
            figures["output_tok_s_repeats"] = [level_figures(r)["output_tok_s"] for r in level_runs]
            modes[mode][str(level)] = figures
    done = [lv for lv in levels if all(str(lv) in modes[m] for m in modes)]
    plain_name = next((m for m in modes if m in (PLAIN, LLAMA_PLAIN)), PLAIN)
    plain = modes.get(plain_name, {})
    gains, crossovers = {}, {}
    for mode in modes:
        if mode == plain_name:
            continue
        gains[mode] = {str(lv): stats.gain(modes[mode][str(lv)]["output_tok_s_repeats"],
                                           plain[str(lv)]["output_tok_s_repeats"]) for lv in done if str(lv) in plain}
        crossovers[mode] = stats.crossover(done, [gains[mode][str(lv)]["gain"] for lv in done if str(lv) in gains[mode]])
    tables = {}
    fixed = {m: (m.split(":")[0], int(m.split(":")[1])) for m in gains if m.split(":")[-1].isdigit()}  # K known
    for family in dict.fromkeys(f for f, _ in fixed.values()):
        by_k = {k: [gains[m].get(str(lv), {}).get("gain") for lv in done] for m, (f, k) in fixed.items() if f == family}
        tables[family] = stats.k_table(done, by_k) if done else []
    return {"levels": done, "plain": plain_name, "modes": modes, "gain": gains, "crossover": crossovers, "k_table": tables}
