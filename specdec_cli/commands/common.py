"""What every subcommand shares: pair-selection options, K parsing, and turning user mistakes into
one line on stderr with exit code 2 instead of a traceback."""

# torch and transformers are imported inside the functions that need them, so that --help and bad options answer without them.
from __future__ import annotations

import functools
import io
import math
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Callable, Optional

import typer
from rich.console import Console
from rich.text import Text

from ..errors import UserError
from ..limits import MAX_BATCH, MAX_K, SEEDS
from ..pairs import free_kinds
from ..pairs.registry import HEAD, PairSpec, load_registry, override
from ..runtime.threads import THREADS_PER_CORE, most_threads

if TYPE_CHECKING:
    from ..decoding.acceptance import SamplingParams
    from ..decoding.rules import AcceptRule

# One definition per option that several commands take, so that its spelling, type name and help
# read the same everywhere. Defaults that differ between commands stay in each signature.
PairOption = Annotated[Optional[str], typer.Option("--pair", "-p", metavar="NAME", help="Pair name from models.yaml (default: the file's `default`).")]
ModelsOption = Annotated[
    Optional[str],
    typer.Option("--models", metavar="FILE", help="Pair registry file. Else $SPECDEC_MODELS, ./models.yaml, then the packaged copy.", envvar=None),
]
TargetOption = Annotated[Optional[str], typer.Option("--target", metavar="SOURCE", help="Override the pair's target: hf:ID, package:PKG/FILE, a directory or a .gguf.")]
DraftOption = Annotated[Optional[str], typer.Option("--draft", metavar="SOURCE", help="Override the pair's draft: a model source as for --target, a head directory from train-draft, or 'ngram'.")]
DrafterOption = Annotated[Optional[str], typer.Option("--drafter", metavar="KIND", help="Drafter kind: 'model' (the pair's draft model), 'head' (its draft head), or one that needs no weights: " + free_kinds.described() + "; the pair's default `draft:` or one listed under `drafters:` (those without a file are always there).")]
PromptsOption = Annotated[Path, typer.Option("--prompts", metavar="FILE", help="Prompt file: one prompt per line, plain text or JSON with 'prompt' and optional 'id', 'scenario'.")]
MaxNewTokensOption = Annotated[int, typer.Option("--max-new-tokens", metavar="N", help="Most new tokens per answer (per prompt, and per K or mode where there are several).")]
TemperatureOption = Annotated[float, typer.Option("--temperature", metavar="T", help="0 decodes greedily; above 0 samples (speculative sampling keeps the target's distribution).")]
SeedOption = Annotated[int, typer.Option("--seed", metavar="N", help="Seed for sampling, 0 to 2^64 - 1: under the default rule (--accept exact) it fixes the text, whatever K and drafter; each prompt starts from it.")]
RawOption = Annotated[bool, typer.Option("--raw", help="Send prompts as they are, without the model's chat template.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Results as JSON on stdout instead of text and tables.")]
ProfileOption = Annotated[Optional[str], typer.Option("--profile", metavar="FILE", help="Calibration profile. Default: the pair's `profile:` key, else $SPECDEC_PROFILE, else ~/.config/specdec/profile.yaml.")]
TreeOption = Annotated[Optional[str], typer.Option("--tree", metavar="N|auto", help=f"Draft a tree of at most N nodes (1 to {MAX_K}) with the pair's draft head and verify it in one forward, instead of a chain of K (-k). auto: adaptive K (-k auto) may also choose trees, round by round.")]
ThreadsOption = Annotated[Optional[int], typer.Option("--threads", metavar="N", help=f"Torch CPU threads, at most {THREADS_PER_CORE} per core (default: OMP_NUM_THREADS, else torch's choice, one per core).")]
TreeBudgetsOption = Annotated[Optional[str], typer.Option("--tree", metavar="N,N,...", help=f"Also measure the pair's draft head drafting trees of these node budgets (1 to {MAX_K}), beside the chains of K; --write keeps what they did for -k auto's trees.")]
DtypeOption = Annotated[Optional[str], typer.Option("--dtype", metavar="DTYPE", help="Target precision: float32, bfloat16, int8 or int4 (weight-only, on a CPU; an int4 GGUF keeps its own 4-bit blocks), gguf (a GGUF's every tensor at the precision the file holds, on specdec's kernels), float16, auto. Default: the pair's `dtype:`.")]
ConcurrencyOption = Annotated[Optional[str], typer.Option("--concurrency", metavar="N,N,...", help="Serving engine: requests kept in flight, one level each (default 1,4).")]
AcceptOption = Annotated[str, typer.Option("--accept", metavar="RULE", help="Acceptance rule. exact (the default): lossless, and under sampling the seed fixes the text whatever K and drafter. standard: min(1, p/q) with a residual draw; lossless in distribution and keeps more of a draft model's tokens, but the seed fixes the text only for a given drafter and K (greedy: the same as exact). Or a LOSSY relaxed rule, lenient:L, typical:EPS,DELTA or top:N, whose output is no longer the target's and is flagged as such (README: 'Why specdec is lossless by default').")]

# The least temperature that samples: logits divided by a smaller one overflow float32 (1e-320 made
# every probability nan); at this one logits up to 1e32 still fit, and sampling is all but greedy already.
LEAST_TEMPERATURE = 1e-6
WRITE_FAILED = 3  # the result went to stdout, but a file that was asked for could not be written


def error_line(message: str) -> None:
    """`specdec: error: MESSAGE` on stderr, on one line whatever the terminal's width."""
    stderr_console().print(Text.assemble(("specdec: error:", "bold red"), " ", message), soft_wrap=True)


def warning_line(message: str) -> None:
    """`specdec: warning: MESSAGE` on stderr, on one line: a warning that wraps mid-sentence reads as two."""
    stderr_console().print(Text.assemble(("specdec: warning:", "yellow"), " ", message), soft_wrap=True)


class _RightTrimmed(io.TextIOBase):
    """Passes text on line by line without the trailing blanks that rich pads table cells with."""

    def __init__(self, out):
        self.out, self.pending = out, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self.out.write(line.rstrip() + "\n")
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.out.write(self.pending)
            self.pending = ""
        self.out.flush()


def plain_console() -> Console:
    """The console for results on stdout: the terminal's own width there; to a file or a pipe, one
    line per table row (no value split across lines) and no trailing padding."""
    if sys.stdout.isatty():
        return Console(highlight=False)
    return Console(file=_RightTrimmed(sys.stdout), width=1000, highlight=False, color_system=None)


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def fail(message: str, code: int = 2) -> typer.Exit:
    error_line(message)
    return typer.Exit(code)


def check_count(option: str, value: int | None, least: int) -> None:
    if value is not None and value < least:
        raise UserError(f"{option} must be at least {least}, got {value}")


def check_batch(value: int | None) -> None:
    """--batch: 1 to MAX_BATCH prompts at once."""
    check_count("--batch", value, 1)
    if value is not None and value > MAX_BATCH:
        raise UserError(f"--batch must be at most {MAX_BATCH}, got {value}")


def check_number(option: str, value: float | None, least: float, most: float | None = None, *, above: bool = False) -> None:
    """A float option is a finite number in its range (above ``least`` where ``above``, else from it;
    up to ``most``): nan fails no ``value < least`` test and inf passes every lower bound, so a check
    of the bounds alone lets both through, into a traceback or random tokens."""
    if value is None or (math.isfinite(value) and (value > least if above else value >= least)
                         and (most is None or value <= most)):
        return
    if most is not None:
        words = f"in ({least:g}, {most:g}]" if above else f"from {least:g} to {most:g}"
    else:
        words = f"above {least:g} and finite" if above else f"{least:g} or more and finite"
    raise UserError(f"{option} must be {words}, got {value}")


def check_seed(seed: int, runs: int = 1, runs_option: str = "") -> None:
    """Seeds are 64 bits (limits.SEEDS): each from 0 to 2⁶⁴ − 1 fixes its own text, and one beyond
    would stand for another (2⁶⁴ for 0, −1 for 2⁶⁴ − 1). A command that runs seeds seed … seed +
    ``runs`` − 1 (``runs_option`` says how many) keeps the last of them in range too."""
    most = SEEDS - max(runs, 1)
    if not 0 <= seed <= most:
        given = f" with {runs_option}" if runs > 1 else ""
        raise UserError(f"--seed must be from 0 to {most}{given} (seeds are 64 bits), got {seed}")


def check_threads(threads: int | None) -> None:
    """--threads: from 1 to a few per core (runtime/threads.py says why it has a bound)."""
    most = most_threads()
    if threads is not None and not 1 <= threads <= most:
        raise UserError(f"--threads must be from 1 to {most} ({THREADS_PER_CORE} per core here), got {threads}")


def write_output(option: str, path: Path, write: Callable[[], object]) -> bool:
    """Write a file at the end of a run; a failure is one error line, not the loss of the result,
    which has gone to stdout already. Returns whether the file was written."""
    try:
        write()
        return True
    except OSError as exc:
        error_line(f"could not write {option} {path}: {exc.strerror or exc} (the result is on stdout)")
        return False


def user_errors(command):
    """Turn a UserError anywhere below a command into exit code 2 with a one-line message."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except UserError as exc:
            raise fail(str(exc)) from None

    return wrapper


def refuse_given(names: tuple[str, ...], why: str) -> None:
    """A UserError naming the first of these parameters that the command line set: the branch the
    command takes does not use it (``why``), and an option dropped silently misleads."""
    from typer._click.core import ParameterSource
    from typer._click.globals import get_current_context

    context = get_current_context()
    for param in context.command.params:
        if param.name in names and context.get_parameter_source(param.name) not in (None, ParameterSource.DEFAULT):
            raise UserError(f"{'/'.join(sorted(param.opts, key=len))} {why}")


def invocation(command: str) -> dict[str, str]:
    """A result's manifest begins with what made it: the command line as given (``specdec COMMAND``
    when it was called without one), less any URL's password, and the UTC date."""
    from ..serving.client import USERINFO

    given = [USERINFO.sub(r"\1", arg) for arg in sys.argv[1:]]
    return {"command": "specdec " + shlex.join(given) if given else f"specdec {command}",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def check_tree_drafter(spec: PairSpec) -> None:
    """--tree drafts with the pair's head: said before anything loads."""
    if spec.drafter.kind != HEAD:
        raise UserError(f"--tree needs a draft head, and pair {spec.name!r} drafts with {spec.drafter.kind!r}; "
                        "choose its head with --drafter head")


def resolve_pair(models: str | None, pair: str | None, target=None, draft=None, drafter=None, dtype=None) -> PairSpec:
    return override(load_registry(models).pair(pair), target, draft, drafter, dtype)


def parse_k(text: str | None, allow_auto: bool = False) -> int | str | None:
    """An integer 0..MAX_K (0 = plain decoding), or 'auto' where adaptive K is offered."""
    if text is None:
        return None
    if allow_auto and text == "auto":
        return "auto"
    return bounded("K", text, 0, " or auto" if allow_auto else "")


def parse_tree(text: str | None, k: str | None) -> int | str | None:
    """``--tree``: a node budget 1..MAX_K, or 'auto' (adaptive K weighing trees too; -k auto or no -k)."""
    if text is None:
        return None
    if text == "auto":
        if k not in (None, "auto"):
            raise UserError("--tree auto lets -k auto choose trees: give -k auto or no -k")
        return "auto"
    if k is not None:
        raise UserError("-k drafts a chain and --tree a tree: give one of them")
    return bounded("--tree", text, 1, " or auto")


def bounded(name: str, text: str, least: int, words: str = "") -> int:
    """An integer from ``least`` to MAX_K; ``words``: what else the option takes, for the error."""
    try:
        value = int(text)
    except ValueError:
        raise UserError(f"{name} must be an integer from {least} to {MAX_K}{words}, got {text!r}") from None
    if not least <= value <= MAX_K:
        raise UserError(f"{name} must be from {least} to {MAX_K}, got {value}")
    return value


def parse_k_list(text: str, option: str = "--k", least: int = 0) -> list[int]:
    """'1,4,8' → [1, 4, 8], each checked by parse_k; duplicates dropped, order kept."""
    ks = []
    for part in text.split(","):
        if not part.strip():
            raise UserError(f"{option} {text!r}: expected comma-separated integers from {least} to {MAX_K}")
        try:
            ks.append(parse_k(part.strip()))
        except UserError as exc:
            raise UserError(f"{option} {text!r}: {exc}") from None
        if ks[-1] < least:
            raise UserError(f"{option} {text!r}: each must be from {least} to {MAX_K}, got {ks[-1]}")
    return list(dict.fromkeys(ks))


def stdin_is_interactive() -> bool:
    return sys.stdin is None or (hasattr(sys.stdin, "isatty") and sys.stdin.isatty())


def sampling_params(temperature: float, top_k: int, top_p: float) -> SamplingParams:
    check_sampling_options(temperature, top_k, top_p)
    from ..decoding.acceptance import SamplingParams

    return SamplingParams(temperature, top_k, top_p)


def check_sampling_options(temperature: float, top_k: int, top_p: float) -> None:
    """The sampling options' bounds, checked without importing torch."""
    check_number("--temperature", temperature, 0)
    if 0 < temperature < LEAST_TEMPERATURE:
        raise UserError(f"--temperature must be 0 (greedy) or {LEAST_TEMPERATURE:g} or more, got {temperature}")
    if top_k < 0:
        raise UserError(f"--top-k must be 0 or more, got {top_k}")
    check_number("--top-p", top_p, 0, 1, above=True)



def accept_rule(text: str) -> AcceptRule:
    """The --accept rule, checked without torch; a lossy one is announced on stderr, once."""
    from ..decoding.rules import parse_rule

    rule = parse_rule(text)
    if not rule.lossless:
        warning_line(lossy_message(f"--accept {rule} is"))
    return rule


def lossy_message(subject: str) -> str:
    """``subject``: '--accept RULE is', or the lossy bench modes with their verb."""
    return f"{subject} lossy: the output is not the target's own, nor its sampled text fixed by the seed (lossless: false)"
