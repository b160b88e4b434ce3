"""`specdec train-draft`: make a drafter for a target that has no small sibling, from a prompt file."""

# torch and transformers are imported inside the command bodies, so that --help and bad options answer without them.
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .common import ModelsOption, PairOption, TargetOption, resolve_pair, stderr_console, user_errors


class ProgressReporter:
    """One rich task per phase; training shows its loss and held-out agreement."""

    def __init__(self, progress: Progress):
        self.progress, self.task, self.total = progress, None, None

    def phase(self, description: str, total: int | None) -> None:
        if self.task is not None:  # the previous phase is over: show it full
            self.progress.update(self.task, total=self.total or 1, completed=self.total or 1)
        self.task, self.total = self.progress.add_task(description, total=total, loss="", agreement=""), total

    def advance(self, count: int = 1, loss: float | None = None, agreement: float | None = None) -> None:
        fields = {}
        if loss is not None:
            fields["loss"] = f"loss {loss:.3f}"
        if agreement is not None:
            fields["agreement"] = f"held-out top-1 {agreement:.1%}"
        self.progress.update(self.task, advance=count, **fields)


@user_errors
def train_draft(
    out: Annotated[Path, typer.Option("--out", help="Directory for the drafter, its held-out prompts and its checkpoint.")],
    kind: Annotated[str, typer.Option("--kind", help="'model': a stand-alone draft LM (see --hidden-size); 'head': an EAGLE-style head on the target's features.")],
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="Prompt file: one prompt per line, text or JSON with 'prompt' (and 'id', 'scenario'). Not needed with --resume or --data-from.")] = None,
    steps: Annotated[Optional[int], typer.Option(help="Stop after this many optimiser steps in all (counted across --resume).")] = None,
    minutes: Annotated[Optional[float], typer.Option(help="Stop training after this many minutes of this run.")] = None,
    seed: Annotated[int, typer.Option(help="Seed for the held-out split, sampled answers, initialisation and batches.")] = 0,
    top_k: Annotated[int, typer.Option("--top-k", help="Teacher log-probs kept per position for the soft cross-entropy.")] = 64,
    top_vocab: Annotated[int, typer.Option("--top-vocab", help="Restrict the draft's output layer to the N tokens the target writes most (0: the whole vocabulary).")] = 0,
    holdout: Annotated[float, typer.Option(help="Fraction of prompts held out to measure agreement.")] = 0.1,
    lr: Annotated[Optional[float], typer.Option(help="Learning rate (default 1e-4 for a model, 1e-3 for a head).")] = None,
    batch_size: Annotated[int, typer.Option(help="Sequences per batch, for the teacher pass and training.")] = 8,
    answer_batch_size: Annotated[int, typer.Option(help="Prompts the target answers at once (larger is faster on a CPU, up to memory).")] = 32,
    max_new_tokens: Annotated[int, typer.Option(help="Length of the target's answers to the prompts.")] = 128,
    temperature: Annotated[float, typer.Option(help="Temperature of the sampled answers (a greedy answer is made too).")] = 0.8,
    sampled: Annotated[bool, typer.Option("--sampled/--greedy-only", help="Also a sampled answer per prompt, or the greedy one alone (more prompts beat more answers per prompt).")] = True,
    raw: Annotated[bool, typer.Option("--raw", help="Send prompts as they are, without the chat template.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the checkpoint in --out (data and trainer state).")] = False,
    data_from: Annotated[Optional[Path], typer.Option("--data-from", help="Reuse the target's answers from another run's --out (same target) instead of generating new ones.")] = None,
    hidden_size: Annotated[int, typer.Option("--hidden-size", help="--kind model: width of a fresh, small draft (its embedding starts as the target's, projected); 0 copies 2 of the target's layers at full width.")] = 0,
    layers: Annotated[int, typer.Option("--layers", help="--kind model: decoder layers (default 2 copied from the target, or 4 in a --hidden-size draft).")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="The summary as one JSON object on stdout.")] = False,
    pair: PairOption = None,
    target: TargetOption = None,
    models: ModelsOption = None,
) -> None:
    """Train a drafter for the pair's target by distillation from the target's own answers.

    The target answers the prompts (greedy and sampled), a teacher pass keeps its top-k log-probs
    (and, for a head, its hidden states), and the drafter learns them within --steps/--minutes.
    Use the result with `--draft OUT` (a head: `--drafter head --draft OUT`) or in models.yaml.
    """
    from ..training import draft_job
    from ..training.distill import AnswerSettings

    spec = resolve_pair(models, pair, target)
    settings = draft_job.JobSettings(
        kind=kind, prompts=prompts, out=out, target=spec.target, steps=steps, minutes=minutes, seed=seed, top_k=top_k,
        top_vocab=top_vocab, holdout=holdout, lr=lr, batch_size=batch_size, raw=raw, resume=resume, data_from=data_from,
        hidden_size=hidden_size, layers=layers,
        answers=AnswerSettings(max_new_tokens, temperature, answer_batch_size, seed, sampled),
    )
    settings.check()
    console = stderr_console()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[loss]}"),
               TextColumn("{task.fields[agreement]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        summary = draft_job.run(settings, ProgressReporter(progress))
    if json_out:
        print(json.dumps(summary))
        return
    agreement = summary["heldout_agreement"]
    use = f"--drafter head --draft {out}" if summary["kind"] == "head" else f"--draft {out}"
    print(f"saved a {summary['kind']} drafter to {out} after {summary['steps']} steps; held-out top-1 agreement "
          f"{'–' if agreement is None else f'{agreement:.1%}'}; use it with `specdec generate {use}`")
