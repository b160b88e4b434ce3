"""`specdec generate`: speculative generation with a live acceptance view, text or JSON lines out."""

# torch and transformers are imported inside the command bodies, so that --help and bad options answer without them.
from __future__ import annotations

import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Iterable, Iterator, Optional

import typer

from ..runtime import threads as thread_policy
from ..decoding.rules import check_tree_rule
from ..decoding.drafters.suffix_file import recognise
from . import interrupt
from ..atomic import check_writable
from ..errors import UserError
from ..limits import MAX_K
from ..pairs.profile import ProfileWatcher, open_profile
from ..pairs.registry import SUFFIX
from ..prompts import BadPrompt, Prompt, parse_lines
from .common import (
    AcceptOption,
    DrafterOption,
    DraftOption,
    DtypeOption,
    MaxNewTokensOption,
    ModelsOption,
    PairOption,
    ProfileOption,
    RawOption,
    SeedOption,
    TargetOption,
    TemperatureOption,
    ThreadsOption,
    TreeOption,
    WRITE_FAILED,
    accept_rule,
    check_batch,
    check_count,
    check_seed,
    check_threads,
    check_tree_drafter,
    check_sampling_options,
    parse_k,
    parse_tree,
    resolve_pair,
    sampling_params,
    stderr_console,
    stdin_is_interactive,
    user_errors,
    warning_line,
    write_output,
)

DEFAULT_BATCH = 16  # piped prompts decoded at once: the most throughput here (docs/batching.md, "Measured")
PROMPTS_FAILED = 1  # exit code: some prompts of the stream failed, each said on stderr (and in --json); the rest ran

if TYPE_CHECKING:
    from ..decoding.control.controller import AdaptiveController
    from ..decoding.loaded_pair import LoadedPair


@user_errors
def generate(
    prompt: Annotated[
        Optional[str],
        typer.Argument(metavar="PROMPT", help="The prompt. '-', or nothing with a pipe, reads one prompt per line from stdin: text, or JSON with 'prompt' and optional 'id', 'scenario'."),
    ] = None,
    pair: PairOption = None,
    k: Annotated[Optional[str], typer.Option("--k", "-k", metavar="K", help=f"Draft tokens per round, 0 (plain decoding) to {MAX_K}, or auto (adapt online, starting from the calibration profile). Default: auto when the pair has a profile or `adaptive: true`, else the pair's K for the prompt's scenario.")] = None,
    drafter: DrafterOption = None,
    dtype: DtypeOption = None,
    tree: TreeOption = None,
    max_new_tokens: MaxNewTokensOption = 128,
    temperature: TemperatureOption = 0.0,
    top_k: Annotated[int, typer.Option("--top-k", metavar="N", help="Sample among the N most likely tokens only (0: all).")] = 0,
    top_p: Annotated[float, typer.Option("--top-p", metavar="P", help="Sample from the smallest set of tokens with this much probability (1: all).")] = 1.0,
    seed: SeedOption = 0,
    raw: RawOption = False,
    json_lines: Annotated[bool, typer.Option("--json", help="One JSON object per prompt on stdout: id, prompt, text, token_ids, stats.")] = False,
    target: TargetOption = None,
    draft: DraftOption = None,
    models: ModelsOption = None,
    profile: ProfileOption = None,
    threads: ThreadsOption = None,
    accept: AcceptOption = "exact",
    batch: Annotated[Optional[int], typer.Option("--batch", metavar="N", help=f"Decode up to N piped prompts at once, each with its own cache, drafts and acceptance, all verified in one target forward a step; each answer is token for token what it is alone. Results stay in input order. Default: {DEFAULT_BATCH} for a stream on stdin where the target runs specdec's lean forward, else 1.")] = None,
    memory: Annotated[Optional[Path], typer.Option("--memory", metavar="FILE", help="Keep the suffix memory (the token ids of earlier answers) in FILE between runs: read at the start, this run's answers added at the end. It drafts beside the pair's drafter under -k auto; with a fixed -k, give --drafter suffix.")] = None,
) -> None:
    """Generate with speculative decoding, showing which draft tokens the target accepted.

    On a terminal, stderr shows the answer as it is written: accepted draft tokens in green, rejected
    ones struck out, tokens the target chose itself in bold, with the running acceptance rate and
    speed. When a prompt is done the view gives way to the answer alone and a summary line.
    Results always go to stdout, as text or (--json) as JSON lines.
    """
    # Everything that needs no model is checked before torch is imported (under a second).
    check_sampling_options(temperature, top_k, top_p)
    check_count("--max-new-tokens", max_new_tokens, 1)
    check_threads(threads)
    check_seed(seed)
    batch_given = batch is not None
    check_batch(batch)
    fixed_k = parse_k(k, allow_auto=True)
    rule = accept_rule(accept)
    tree = parse_tree(tree, k)
    if tree is not None:
        fixed_k = tree  # a fixed tree: the engine's K is its node budget; auto: adaptive, trees weighed too
        check_tree_rule(rule)
    prompts = _prompts(prompt)
    if batch is None:
        batch = 1 if isinstance(prompts, list) else DEFAULT_BATCH
    spec = resolve_pair(models, pair, target, draft, drafter, dtype)
    if tree is not None:
        check_tree_drafter(spec)
    if memory is not None:
        memory = check_writable(memory, "--memory", ours=recognise)  # a file that is no memory file is left alone
        if isinstance(fixed_k, int) and (fixed_k == 0 or spec.drafter.kind != SUFFIX):
            raise UserError("--memory keeps the suffix memory, which a fixed -k or --tree drafts with only under "
                            "--drafter suffix (and K above 0); use -k auto or --drafter suffix")

    thread_policy.apply(threads)  # before torch loads
    from ..decoding.loaded_pair import load_pair
    from .answering import Settings, answer

    sampling = sampling_params(temperature, top_k, top_p)
    console = stderr_console()
    watcher = _profile_watcher(spec, fixed_k, profile, console)
    live = not json_lines and console.is_terminal
    interrupt.now("loading the pair")
    with console.status(f"loading {spec.name}…") if live else nullcontext():
        # -k 0 loads no drafter; decoding needs no transformers model class (pairs/loading.py)
        runtime = load_pair(spec, drafting=fixed_k != 0, lean=True)
    computed_by = runtime.target.computed_by()
    if watcher:
        watcher.expect(computed_by)
    controller = _controller(spec, fixed_k, watcher, console, not json_lines, runtime, tree == "auto")
    if isinstance(tree, int):
        runtime.drafter = runtime.tree_drafter()

    if batch_given:
        runtime.engine.check_batch(batch)
    elif runtime.engine.batched is None:  # the default batches where the lean forward runs
        batch = 1
    running = controller  # hot reload replaces it; the memory file keeps the first's drafter

    def schedule_for(item: Prompt):
        """The prompt's K, and what its statistics say of it (hot reload: a recalibration applies from the next prompt)."""
        nonlocal running
        if watcher and watcher.changed():
            running = _controller(spec, fixed_k, watcher, console, not json_lines, runtime, tree == "auto")
        if running is None:
            return fixed_k, {}
        profile_path = str(watcher.path) if watcher.profile else None  # which profile seeded auto (None: the pair's K)
        return running.schedule(item.scenario), {"profile": profile_path}

    settings = Settings(runtime, schedule_for, max_new_tokens, sampling, seed, raw, rule, tree, json_lines, computed_by, batch)
    with _memory_kept(runtime, controller, memory):
        failed = answer(settings, prompts, console if live else None)
    if failed:
        raise typer.Exit(PROMPTS_FAILED)


@contextmanager
def _memory_kept(runtime: LoadedPair, controller, path: Path | None) -> Iterator[None]:
    """With --memory: the run's suffix memory filled from ``path`` before the prompts, and this run's
    answers added to the file after them, however the run ends."""
    if path is None:
        yield
        return
    kept = _memory_file(runtime, controller, path)
    try:
        yield
    finally:
        # A stop keeps what it kept before, and the memory file as it was until save() has replaced it.
        doing, before = interrupt.current()
        interrupt.now(f"adding this run's answers to {kept.path}", f"{before}; the memory file is left as it was")
        if not write_output("--memory", kept.path, kept.save):
            raise typer.Exit(WRITE_FAILED)
        interrupt.now(doing, f"{before}; {kept.path} keeps this run's answers" if kept.saved else before)


def _memory_file(runtime: LoadedPair, controller, path: Path):
    """The run's suffix memory tied to ``path`` and filled from it: the drafter's own, or, under
    -k auto, one put beside the pair's drafter."""
    from ..decoding.drafters.base import parts
    from ..decoding.drafters.suffix import SuffixDrafter
    from ..decoding.drafters.suffix_file import MemoryFile
    from ..decoding.head_files import target_identity

    memory = next((d for d in parts(runtime.drafter)[0] if isinstance(d, SuffixDrafter)), None)
    if memory is None:
        if controller is None:
            raise UserError("--memory keeps the suffix memory, which only -k auto or --drafter suffix drafts with; "
                            f"pair {runtime.pair.name!r} runs a fixed K here")
        memory = SuffixDrafter(vocab_limit=runtime.target.model.config.get_text_config().vocab_size)
        runtime.put_beside(memory)
    kept = MemoryFile(path, target_identity(runtime.target.model, runtime.target.source), memory)
    problem = kept.load()
    if problem:
        warning_line(problem)
    return kept


def _profile_watcher(spec, fixed_k, explicit, console) -> ProfileWatcher | None:
    """The pair's calibration profile, watched for changes; none is needed for a fixed K."""
    if isinstance(fixed_k, int):
        return None
    return open_profile(explicit, spec, warn=warning_line)


def _controller(spec, fixed_k, watcher: ProfileWatcher | None, console, say: bool, runtime: LoadedPair,
                trees: bool = False) -> AdaptiveController | None:
    """Adaptive K for `-k auto`, and by default whenever the pair has a profile or says `adaptive: true`;
    stderr (or, with --json, each result's stats) says which profile seeds it. ``trees``: `--tree auto`."""
    if watcher is None or (fixed_k is None and watcher.profile is None and not spec.adaptive):
        return None
    if say:
        console.print(f"specdec: {watcher.seeded()}", soft_wrap=True)
    return runtime.controller(watcher.profile, trees)


def _prompts(argument: str | None) -> Iterable[Prompt | BadPrompt]:
    """The command line's prompt, or stdin's stream: a line there that is no prompt comes as its BadPrompt."""
    if argument is not None and argument != "-":
        if not argument.strip():
            raise UserError("the prompt is empty")
        return [Prompt(1, argument)]
    if argument is None and stdin_is_interactive():
        raise UserError("no prompt: give one as an argument, or pipe prompts on stdin (one per line)")
    return parse_lines(sys.stdin, "stdin", go_on=True)
