"""`specdec train-draft`: make a drafter for a target that has no small sibling, from a prompt file."""

# torch and transformers are imported inside the command bodies, so that --help and bad options answer without them.
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import interrupt
from ..runtime import threads as thread_policy
from . import own_files
from ..atomic import check_writable
from .common import (
    DtypeOption,
    MaxNewTokensOption,
    ModelsOption,
    PairOption,
    PromptsOption,
    RawOption,
    TargetOption,
    LEAST_TEMPERATURE,
    ThreadsOption,
    check_count,
    check_number,
    check_seed,
    check_threads,
    resolve_pair,
    stderr_console,
    user_errors,
)


class ProgressReporter:
    """One rich task per phase; training shows its loss and held-out agreement. ``checkpoint``: what
    Ctrl-C keeps once training starts (the data is saved before it), or from the start with --resume."""

    def __init__(self, progress: Progress, checkpoint: Path | None = None, resume: bool = False):
        self.progress, self.task, self.total = progress, None, None
        self.checkpoint, self.resume = checkpoint, resume

    def phase(self, description: str, total: int | None) -> None:
        if self.task is not None:  # the previous phase is over: show it full
            self.progress.update(self.task, total=self.total or 1, completed=self.total or 1)
        self.task, self.total = self.progress.add_task(description, total=total, loss="", agreement=""), total
        kept = self.checkpoint is not None and (self.resume or description == "training")
        doing = description if description in ("loading the target", "training") else f"making the data ({description})"
        interrupt.now(doing, f"{self.checkpoint} keeps the data and the last saved training state: --resume "
                             "continues it" if kept else interrupt.NOTHING)

    def advance(self, count: int = 1, loss: float | None = None, agreement: float | None = None) -> None:
        fields = {}
        if loss is not None:
            fields["loss"] = f"loss {loss:.3f}"
        if agreement is not None:
            fields["agreement"] = f"held-out top-1 {agreement:.1%}"
        self.progress.update(self.task, advance=count, **fields)


@user_errors
def train_draft(
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="Directory for the drafter, its held-out prompts and its checkpoint (created, with missing parents).")],
    kind: Annotated[str, typer.Option("--kind", metavar="model|head", help="'model': a stand-alone draft LM (see --hidden-size); 'head': an EAGLE-style head on the target's features.")],
    prompts: Annotated[Optional[Path], PromptsOption.__metadata__[0]] = None,
    steps: Annotated[Optional[int], typer.Option("--steps", metavar="N", help="Stop after N optimiser steps in all (counted across --resume).")] = None,
    minutes: Annotated[Optional[float], typer.Option("--minutes", metavar="M", help="Stop training after M minutes of this run.")] = None,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Seed for the held-out split, sampled answers, initialisation and batches.")] = 0,
    top_k: Annotated[int, typer.Option("--top-k", metavar="N", help="Teacher log-probs kept per position for the soft cross-entropy.")] = 64,
    top_vocab: Annotated[int, typer.Option("--top-vocab", metavar="N", help="Restrict the draft's output layer to the N tokens the target writes most (0: the whole vocabulary).")] = 0,
    holdout: Annotated[float, typer.Option("--holdout", metavar="FRACTION", help="Share of the prompts held out to measure agreement.")] = 0.1,
    lr: Annotated[Optional[float], typer.Option("--lr", metavar="RATE", help="Learning rate (default 1e-4 for a model, 1e-3 for a head).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", metavar="N", help="Sequences per batch, for the teacher pass and training.")] = 8,
    answer_batch_size: Annotated[int, typer.Option("--answer-batch-size", metavar="N", help="Prompts the target answers at once (larger is faster on a CPU, up to memory).")] = 32,
    max_new_tokens: MaxNewTokensOption = 128,
    temperature: Annotated[float, typer.Option("--temperature", metavar="T", help="Temperature of the sampled answers (a greedy answer is made too).")] = 0.8,
    sampled: Annotated[bool, typer.Option("--sampled/--greedy-only", help="Also a sampled answer per prompt, or the greedy one alone (more prompts beat more answers per prompt).")] = True,
    raw: RawOption = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the checkpoint in --out (data and trainer state).")] = False,
    data_from: Annotated[Optional[Path], typer.Option("--data-from", metavar="DIR", help="Reuse the target's answers from another run's --out (same target) instead of generating new ones.")] = None,
    hidden_size: Annotated[Optional[int], typer.Option("--hidden-size", metavar="H", help="--kind model: width of a fresh, small draft (its embedding starts as the target's, projected). Default: 2 of the target's layers at full width.")] = None,
    layers: Annotated[Optional[int], typer.Option("--layers", metavar="N", help="--kind model: decoder layers. Default: 2 copied from the target, or 4 in a --hidden-size draft.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="The summary as one JSON object on stdout.")] = False,
    pair: PairOption = None,
    target: TargetOption = None,
    models: ModelsOption = None,
    threads: ThreadsOption = None,
    dtype: DtypeOption = None,
) -> None:
    """Train a drafter for the pair's target by distillation from the target's own answers.

    The target answers the prompts (greedy and sampled), a teacher pass keeps its top-k log-probs
    (and, for a head, its hidden states), and the drafter learns them within --steps/--minutes.
    Use the result with `--draft OUT` (a head: `--drafter head --draft OUT`) or in models.yaml.
    """
    check_threads(threads)
    check_seed(seed)
    check_number("--minutes", minutes, 0)
    check_number("--lr", lr, 0, above=True)
    if sampled:
        check_number("--temperature", temperature, LEAST_TEMPERATURE)
    check_count("--layers", layers, 1)
    check_count("--hidden-size", hidden_size, 1)
    check_writable(out, "--out", directory=True, ours=own_files.training_run)
    spec = resolve_pair(models, pair, target, dtype=dtype)  # the target answers and gives features at this precision

    thread_policy.apply(threads)  # before torch loads
    from ..training import draft_job
    from ..training.distill import AnswerSettings

    settings = draft_job.JobSettings(
        kind=kind, prompts=prompts, out=out, target=spec.target, steps=steps, minutes=minutes, seed=seed, top_k=top_k,
        top_vocab=top_vocab, holdout=holdout, lr=lr, batch_size=batch_size, raw=raw, resume=resume, data_from=data_from,
        hidden_size=hidden_size or 0, layers=layers or 0,
        answers=AnswerSettings(max_new_tokens, temperature, answer_batch_size, seed, sampled),
    )
    settings.check()
    console = stderr_console()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[loss]}"),
               TextColumn("{task.fields[agreement]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        summary = draft_job.run(settings, ProgressReporter(progress, out / "checkpoint", resume))
    if json_out:
        print(json.dumps(summary))
        return
    agreement = summary["heldout_agreement"]
    use = f"--drafter head --draft {out}" if summary["kind"] == "head" else f"--draft {out}"
    print(f"saved a {summary['kind']} drafter to {out} after {summary['steps']} steps; held-out top-1 agreement "
          f"{'–' if agreement is None else f'{agreement:.1%}'}; use it with `specdec generate {use}`")
