"""`specdec bench --batch`'s figures, as small pure functions: what each job (every prompt through
one mode at one batch size, timed whole) gives, speculation's gain over plain decoding at the same
batch size, the per-batch-size K table and the break-even batch size (serving/stats.py's, the engine
bench's own), and their table, lines and Markdown. Nothing here runs a model or imports torch."""

from __future__ import annotations

import json
from dataclasses import dataclass

from rich.table import Table

from ..serving.stats import crossover, k_table, percentile
from .mode_kinds import AUTO_KINDS, TREE_KINDS

PLAIN = "plain"
PERCENTILES = (50, 90, 99)


@dataclass
class Job:
    """One mode's run of every prompt at one batch size, through the engine's one loop."""

    tokens: list[list[int]]  # per prompt, in input order
    latencies_s: list[float]  # per prompt: from when its request was handed to the engine to its last round
    wall_s: float  # the job, timed whole
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    judged: int = 0  # drafts the target tested: α = accepted / judged
    fallback_forwards: int = 0
    at_once: int = 1  # the most answers that shared a forward: the batch the job reached

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0


def fixed_k(modes) -> dict[str, int]:
    """The speculative modes whose chain length is K every round (not auto's, not a tree's node budget):
    the K table's columns."""
    return {str(m): m.k for m in modes if m.kind != PLAIN and m.kind not in AUTO_KINDS and m.kind not in TREE_KINDS}


def mode_figures(job: Job, plain: Job, plain_alone: Job) -> dict:
    """One job's figures: its throughput against plain decoding at the same batch size (``gain``) and
    at batch 1, its prompts' latency percentiles, and whether every prompt has plain's batch-1 tokens."""
    tps = job.tokens_per_s
    figures = {
        "tokens_per_s": round(tps, 2),
        "gain": round(tps / plain.tokens_per_s, 4) if plain.tokens_per_s else None,
        "vs_plain_batch_1": round(tps / plain_alone.tokens_per_s, 4) if plain_alone.tokens_per_s else None,
        "wall_s": round(job.wall_s, 4),
        "new_tokens": job.new_tokens,
    }
    for q in PERCENTILES:
        value = percentile(job.latencies_s, q)
        figures[f"p{q}_latency_s"] = None if value is None else round(value, 4)
    figures.update(
        mean_tokens_per_round=round(job.new_tokens / job.rounds, 3) if job.rounds else None,
        alpha=round(job.accepted / job.judged, 4) if job.judged else None,
        mean_drafted=round(job.drafted / job.rounds, 3) if job.rounds else None,
        identical_to_plain=job.tokens == plain_alone.tokens,
        max_at_once=job.at_once,
        fallback_forwards=job.fallback_forwards,
    )
    return figures


def report(sizes: list[int], jobs: dict[int, dict[str, Job]], fixed: dict[str, int]) -> dict:
    """Figures per batch size and mode; the K table over the fixed-K modes (the best gain among modes of
    one K), and the batch size where each speculative mode's gain falls below 1."""
    alone = jobs[sizes[0]][PLAIN]
    by_size = {str(size): {mode: mode_figures(job, jobs[size][PLAIN], alone) for mode, job in jobs[size].items()}
               for size in sizes}
    gains = {mode: [by_size[str(size)][mode]["gain"] for size in sizes] for mode in jobs[sizes[0]] if mode != PLAIN}
    by_k: dict[int, list[float | None]] = {}
    for mode, k in fixed.items():
        best = by_k.get(k, [None] * len(sizes))
        by_k[k] = [max((g for g in pair if g is not None), default=None) for pair in zip(best, gains[mode])]
    return {
        "sizes": sizes,
        "by_size": by_size,
        "k_by_batch_size": k_table(sizes, by_k) if by_k else None,
        "break_even_batch": {mode: crossover(sizes, values) for mode, values in gains.items()},
    }


def differing(batch: dict) -> list[str]:
    """The modes whose tokens differed from plain decoding's at batch 1 at some batch size."""
    return list(dict.fromkeys(mode for by_mode in batch["by_size"].values() for mode, f in by_mode.items()
                              if not f["identical_to_plain"]))


def summary_lines(batch: dict) -> list[str]:
    """Where each speculative mode stops paying, and the K table, as the engine bench words them."""
    lines = [f"{mode}: " + (f"the gain falls below 1 at batch {point:g}" if point is not None
                            else "the gain stays at or above 1 at every batch size measured")
             for mode, point in batch["break_even_batch"].items()]
    if batch["k_by_batch_size"] is not None:
        lines.append(f"K by batch size (fixed-K modes; vLLM's num_speculative_tokens_per_batch_size): "
                     f"{json.dumps(batch['k_by_batch_size'])}")
    return lines


def _number(value, unit: str = "") -> str:
    return "–" if value is None else f"{value:.2f}{unit}"


def table(batch: dict, title: str) -> Table:
    """A row per batch size: each mode's tokens/s and its gain over plain at that size."""
    grid = Table(title=title, title_justify="left")
    grid.add_column("batch", justify="right")
    modes = list(batch["by_size"][str(batch["sizes"][0])])
    for mode in modes:
        grid.add_column(f"{mode} tok/s", justify="right")
        if mode != PLAIN:
            grid.add_column("×", justify="right")
    for size in batch["sizes"]:
        by_mode = batch["by_size"][str(size)]
        cells = []
        for mode in modes:
            cells.append(_number(by_mode[mode]["tokens_per_s"]))
            if mode != PLAIN:
                cells.append(_number(by_mode[mode]["gain"], "×") + ("" if by_mode[mode]["identical_to_plain"] else " NO"))
        grid.add_row(str(size), *cells)
    return grid


MARKDOWN_COLUMNS = [("tok/s", "tokens_per_s"), ("gain", "gain"), ("× plain at 1", "vs_plain_batch_1"),
                    ("p50 s", "p50_latency_s"), ("p90 s", "p90_latency_s"), ("p99 s", "p99_latency_s"),
                    ("tok/round", "mean_tokens_per_round"), ("α", "alpha"), ("drafted/round", "mean_drafted")]


def markdown_section(batch: dict) -> list[str]:
    """The page's section: a row per batch size and mode, then the break-even and K table lines."""
    headers = ["batch", "mode", *(h for h, _ in MARKDOWN_COLUMNS), "= plain at 1"]
    lines = ["## Batch sizes (every prompt as one job per size and mode)", "", "| " + " | ".join(headers) + " |",
             "|---" * len(headers) + "|"]
    for size in batch["sizes"]:
        for mode, f in batch["by_size"][str(size)].items():
            cells = [str(size), mode, *(_number(f[key]) for _, key in MARKDOWN_COLUMNS),
                     "yes" if f["identical_to_plain"] else "NO"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines + ["", *(f"- {line}" for line in summary_lines(batch)), ""]
