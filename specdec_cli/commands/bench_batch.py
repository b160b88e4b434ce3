"""`specdec bench --batch N,N,...`: its option, its checks before anything loads, and its output
(measure/batch_bench.py runs it, measure/batch_figures.py makes the figures)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

import typer

from ..atomic import write_atomically
from ..errors import UserError
from ..measure.mode_kinds import HF_KINDS
from .common import WRITE_FAILED, check_batch, plain_console, stderr_console, write_output

BATCH_HELP = ("Speculation's gain against the batch size in this loop: at each size (1 always included), every prompt "
              "as one job per mode, decoded that many at once as `generate --batch N` does, timed whole; per size and "
              "mode tokens/s, the gain over plain at that size and at batch 1, p50/p90/p99 prompt latency, the K table "
              "by batch size and where each mode's gain falls below 1. Every prompt's tokens in every mode are checked "
              "against plain decoding's at batch 1. This loop's lossless modes only, one sample; default modes "
              "plain, ngram:4, spec:4 and head:4 where the pair has them, and auto.")


def parse_sizes(text: str) -> list[int]:
    """'1,2,4,8,16' → [1, 2, 4, 8, 16], ascending, with 1 always in (plain decoding at batch 1 is every
    figure's reference); each within common.check_batch's bounds."""
    parts = [part.strip() for part in text.split(",")]
    if not all(re.fullmatch(r"-?\d+", part) for part in parts):
        raise UserError(f"--batch {text!r}: expected comma-separated batch sizes, as in 1,2,4,8,16")
    sizes = sorted({1, *(int(part) for part in parts)})
    for size in sizes:
        check_batch(size)
    return sizes


def check_options(samples: int, rule) -> None:
    """What --batch measures: every prompt once per mode and size, lossless, each checked against plain."""
    if samples > 1:
        raise UserError(f"--batch runs every prompt once per mode and batch size; --samples {samples} applies "
                        "to the bench without --batch")
    if not rule.lossless:
        raise UserError(f"--batch measures lossless modes, each checked against plain decoding at batch 1; "
                        f"--accept {rule} is lossy")


def check_modes(modes) -> None:
    """This loop's lossless modes only: transformers' generate decodes one prompt at a time here."""
    for mode in modes:
        if mode.kind in HF_KINDS:
            raise UserError(f"--batch measures this loop's modes; {mode} is transformers' generate, which "
                            "bench runs one prompt at a time")
        if not mode.rule.lossless:
            raise UserError(f"--batch measures lossless modes, each checked against plain decoding at batch 1; "
                            f"mode {mode} is lossy")


def batch_sizes(text: str | None, samples: int, accept: str) -> list[int] | None:
    """--batch's sizes (None: not given), what it rules out refused before anything is said or loads."""
    if text is None:
        return None
    from ..decoding.rules import parse_rule

    sizes = parse_sizes(text)
    check_options(samples, parse_rule(accept))
    return sizes


def batch_output(result: dict, json_out: bool, markdown: Path | None, title: str, greedy: bool,
                 page: Callable[[dict], str]) -> None:
    """The result: JSON, or the table by batch size and its lines; modes whose tokens differ named on
    stderr (greedy, as bench does); ``page(result)`` written to --markdown."""
    from ..measure import batch_figures

    if json_out:
        print(json.dumps(result, indent=2))
    else:
        out = plain_console()
        out.print(batch_figures.table(result["batch"], f"{title}; × = tok/s over plain at the same batch size"))
        for line in batch_figures.summary_lines(result["batch"]):
            out.print(line, markup=False, highlight=False, soft_wrap=True)
    differing = batch_figures.differing(result["batch"])
    if differing and greedy:
        stderr_console().print(f"[yellow]modes whose tokens differ from plain decoding at batch 1: {', '.join(differing)}[/]")
    if markdown and not write_output("--markdown", markdown, lambda: write_atomically(markdown, page(result))):
        raise typer.Exit(WRITE_FAILED)
