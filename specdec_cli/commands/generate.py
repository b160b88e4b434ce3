"""`specdec generate`: speculative generation with a live acceptance view, text or JSON lines out."""

# torch and transformers are imported inside the command bodies, so that --help and bad options answer without them.
from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from typing import TYPE_CHECKING, Annotated, Iterable, Optional

import typer

from ..errors import UserError
from ..limits import MAX_K
from ..pairs.profile import ProfileWatcher, open_profile
from ..prompts import Prompt, parse_lines
from .common import (
    DrafterOption,
    DtypeOption,
    DraftOption,
    ModelsOption,
    PairOption,
    TargetOption,
    parse_k,
    resolve_pair,
    sampling_params,
    stderr_console,
    stdin_is_interactive,
    user_errors,
)

if TYPE_CHECKING:
    from ..decoding.adaptive import AdaptiveController
    from ..decoding.runtime import Runtime


@user_errors
def generate(
    prompt: Annotated[
        Optional[str],
        typer.Argument(help="The prompt. '-', or nothing with a pipe, reads one prompt per line from stdin: text, or JSON with 'prompt' and optional 'id', 'scenario'."),
    ] = None,
    pair: PairOption = None,
    k: Annotated[Optional[str], typer.Option("-k", "--k", help=f"Draft tokens per round, 0 (plain decoding) to {MAX_K}, or auto (adapt online, starting from the calibration profile). Default: auto when the pair has a profile or `adaptive: true`, else the pair's K for the prompt's scenario.")] = None,
    drafter: DrafterOption = None,
    dtype: DtypeOption = None,
    max_new_tokens: Annotated[int, typer.Option(help="Most tokens to generate per prompt.")] = 128,
    temperature: Annotated[float, typer.Option(help="0 decodes greedily; above 0 samples (speculative sampling keeps the target's distribution).")] = 0.0,
    top_k: Annotated[int, typer.Option(help="Sample among the k most likely tokens only (0: all).")] = 0,
    top_p: Annotated[float, typer.Option(help="Sample from the smallest set of tokens with this much probability (1: all).")] = 1.0,
    seed: Annotated[int, typer.Option(help="Random seed for sampling; each prompt starts from it.")] = 0,
    raw: Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the model's chat template.")] = False,
    json_lines: Annotated[bool, typer.Option("--json", help="One JSON object per prompt on stdout: id, prompt, text, token_ids, stats.")] = False,
    target: TargetOption = None,
    draft: DraftOption = None,
    models: ModelsOption = None,
    profile: Annotated[Optional[str], typer.Option("--profile", help="Calibration profile (from calibrate-k --write). Default: the pair's `profile:` key, else $SPECDEC_PROFILE, else ~/.config/specdec/profile.yaml.")] = None,
) -> None:
    """Generate with speculative decoding, showing which draft tokens the target accepted.

    On a terminal, stderr shows the answer as it is written: accepted draft tokens in green, rejected
    ones struck out, tokens the target chose itself in bold, with the running acceptance rate and
    speed. Results go to stdout, as text or (--json) as JSON lines.
    """
    from ..decoding.runtime import prepare

    sampling = sampling_params(temperature, top_k, top_p)
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    fixed_k = parse_k(k, allow_auto=True)
    prompts = _prompts(prompt)
    spec = resolve_pair(models, pair, target, draft, drafter, dtype)
    console = stderr_console()
    watcher = _profile_watcher(spec, fixed_k, profile, console)
    controller = _controller(spec, fixed_k, watcher)
    live = not json_lines and console.is_terminal
    with console.status(f"loading {spec.name}…") if live else nullcontext():
        runtime = prepare(spec)

    finished = 0
    try:
        for item in prompts:
            if watcher and watcher.changed():  # hot reload: a recalibration applies from the next prompt
                controller = _controller(spec, fixed_k, watcher)
            k_for_item = controller.schedule(item.scenario) if controller else fixed_k
            result = _run_one(runtime, item, k_for_item, max_new_tokens, sampling, seed, raw, console if live else None)
            if json_lines:
                print(json.dumps(result, ensure_ascii=False), flush=True)
            elif not (live and sys.stdout.isatty()):  # on one terminal the live view already shows it
                print(result["text"], flush=True)
            finished += 1
    except KeyboardInterrupt:
        console.print(f"specdec: interrupted after {finished} finished prompt(s)")
        raise typer.Exit(130) from None


def _run_one(runtime: Runtime, item: Prompt, fixed_k, max_new_tokens, sampling, seed, raw, console) -> dict:
    from ..live import LiveView
    from ..measure.stats import RunStats
    from ..pairs.tokenization import encode_prompt

    tokenizer = runtime.tokenizer
    ids = encode_prompt(tokenizer, item.text, raw)
    k = runtime.pair.k_for(item.scenario) if fixed_k is None else fixed_k
    adaptive = not isinstance(k, int)
    stats = RunStats("auto" if adaptive else k)
    emitted: list[int] = []
    events = runtime.engine.generate(ids, k=k, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed)
    if console is None:
        for event in events:
            stats.add(event)
            emitted += event.emitted
        stats.finish()
    else:
        title = f"{runtime.pair.name} · {runtime.drafter.name} drafter · prompt {item.id}"
        with LiveView(console, tokenizer, title) as view:
            for event in events:
                stats.add(event)
                emitted += event.emitted
                view.update(event, stats, k.describe() if adaptive else None)
            stats.finish()
    result = {
        "id": item.id,
        "prompt": item.text,
        "text": tokenizer.decode(emitted, skip_special_tokens=True),
        "token_ids": emitted,
        "stats": stats.as_dict() | (k.report() if adaptive else {}),
    }
    if item.scenario is not None:
        result["scenario"] = item.scenario
    return result


def _profile_watcher(spec, fixed_k, explicit, console) -> ProfileWatcher | None:
    """The pair's calibration profile, watched for changes; none is needed for a fixed K."""
    if isinstance(fixed_k, int):
        return None
    return open_profile(explicit, spec, warn=lambda message: console.print(f"specdec: {message}"))


def _controller(spec, fixed_k, watcher: ProfileWatcher | None) -> AdaptiveController | None:
    """Adaptive K for `-k auto`, and by default whenever the pair has a profile or says `adaptive: true`."""
    from ..decoding.adaptive import AdaptiveController

    if watcher is None or (fixed_k is None and watcher.profile is None and not spec.adaptive):
        return None
    return AdaptiveController.for_pair(spec, watcher.profile)


def _prompts(argument: str | None) -> Iterable[Prompt]:
    if argument is not None and argument != "-":
        if not argument.strip():
            raise UserError("the prompt is empty")
        return [Prompt(1, argument)]
    if argument is None and stdin_is_interactive():
        raise UserError("no prompt: give one as an argument, or pipe prompts on stdin (one per line)")
    return parse_lines(sys.stdin, "stdin")
