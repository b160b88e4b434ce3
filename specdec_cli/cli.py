"""The `specdec` command line: a typer app with one module per subcommand under `commands/`."""

from __future__ import annotations

import os
import sys

import typer

from .commands.bench import bench_command
from .commands.calibrate import calibrate_k
from .commands.generate import generate
from .commands.models import models
from .commands.train_draft import train_draft
from .commands.verify import verify_equivalence

app = typer.Typer(
    name="specdec",
    help="Lossless speculative decoding: a draft proposes, the target decides, the output stays the target's.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(generate)
app.command()(models)
app.command("verify-equivalence")(verify_equivalence)
app.command("bench")(bench_command)
app.command("calibrate-k")(calibrate_k)
app.command("train-draft")(train_draft)


def main() -> None:
    try:
        app()
    except BrokenPipeError:
        # `specdec generate ... | head -1`: the reader left; end quietly, without a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
