"""What every subcommand shares: pair-selection options, K parsing, and turning user mistakes into
one line on stderr with exit code 2 instead of a traceback."""

# torch and transformers are imported inside the functions that need them, so that --help and bad options answer without them.
from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console

from ..errors import UserError
from ..limits import MAX_K
from ..pairs.registry import PairSpec, load_registry

if TYPE_CHECKING:
    from ..decoding.acceptance import SamplingParams

PairOption = Annotated[Optional[str], typer.Option("--pair", "-p", help="Pair name from models.yaml (default: the file's `default`).")]
ModelsOption = Annotated[
    Optional[str],
    typer.Option("--models", help="Pair registry file. Else $SPECDEC_MODELS, ./models.yaml, then the packaged copy.", envvar=None),
]
TargetOption = Annotated[Optional[str], typer.Option("--target", help="Override the pair's target: hf:ID, package:PKG/FILE, a directory or a .gguf.")]
DraftOption = Annotated[Optional[str], typer.Option("--draft", help="Override the pair's draft: a model source as for --target, a head directory from train-draft, or 'ngram'.")]
DtypeOption = Annotated[
    Optional[str],
    typer.Option("--dtype", help="Target precision: float32, bfloat16, int8 or int4 (weight-only, on a CPU; an int4 GGUF keeps its own blocks), float16, auto. Default: the pair's `dtype:`."),
]
DrafterOption = Annotated[Optional[str], typer.Option("--drafter", help="Drafter kind: 'model' (the pair's draft model), 'head' (its draft head) or 'ngram' (prompt lookup, always there); the pair's default `draft:` or one listed under `drafters:`.")]


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def fail(message: str, code: int = 2) -> typer.Exit:
    stderr_console().print(f"[bold red]specdec: error:[/] {message}", markup=True, soft_wrap=True)
    return typer.Exit(code)


def user_errors(command):
    """Turn a UserError anywhere below a command into exit code 2 with a one-line message."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except UserError as exc:
            raise fail(str(exc)) from None

    return wrapper


def resolve_pair(models: str | None, pair: str | None, target=None, draft=None, drafter=None, dtype=None) -> PairSpec:
    from ..decoding.runtime import override

    return override(load_registry(models).pair(pair), target, draft, drafter, dtype)


def parse_k(text: str | None, allow_auto: bool = False) -> int | str | None:
    """An integer 0..MAX_K (0 = plain decoding), or 'auto' where adaptive K is offered."""
    if text is None:
        return None
    if allow_auto and text == "auto":
        return "auto"
    try:
        k = int(text)
    except ValueError:
        raise UserError(f"K must be an integer from 0 to {MAX_K}{' or auto' if allow_auto else ''}, got {text!r}") from None
    if not 0 <= k <= MAX_K:
        raise UserError(f"K must be from 0 to {MAX_K}, got {k}")
    return k


def stdin_is_interactive() -> bool:
    return sys.stdin is None or (hasattr(sys.stdin, "isatty") and sys.stdin.isatty())


def sampling_params(temperature: float, top_k: int, top_p: float) -> SamplingParams:
    if temperature < 0:
        raise UserError(f"--temperature must be 0 or more, got {temperature}")
    if top_k < 0:
        raise UserError(f"--top-k must be 0 or more, got {top_k}")
    if not 0 < top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1], got {top_p}")
    from ..decoding.acceptance import SamplingParams

    return SamplingParams(temperature, top_k, top_p)

