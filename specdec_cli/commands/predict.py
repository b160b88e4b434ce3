"""`specdec predict`: "will it pay here?" in under a minute, before a long run: the target's verify
curve and the drafter's cost measured on this machine, an acceptance rate given or sampled from a few
prompts, and per K the predicted speed-up, the break-even acceptance and the K to choose."""

# torch and transformers are imported inside the command body, so that --help and bad options answer without them.
from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.table import Table

from ..atomic import check_writable
from ..decoding.rules import EXACT, STANDARD
from ..errors import UserError
from ..measure.prediction import (
    LEAST_CONTEXT,
    MOST_K,
    RULES,
    chosen,
    other_rule_alpha,
    predict,
    round_curve,
    rules_differ,
    spread,
    typical_context,
)
from ..pairs.profile import k_values
from ..pairs.registry import HEAD, MODEL
from ..prompts import check_fit, read_file
from ..runtime import threads as thread_policy
from . import interrupt, own_files
from .calibrate import _check_plotting
from .common import (
    WRITE_FAILED,
    DrafterOption,
    DraftOption,
    DtypeOption,
    ModelsOption,
    PairOption,
    RawOption,
    TargetOption,
    ThreadsOption,
    check_count,
    check_number,
    check_seed,
    check_threads,
    plain_console,
    refuse_given,
    resolve_pair,
    sampling_params,
    stderr_console,
    user_errors,
    write_output,
)

VERIFY_REPS = 30  # passes over the block lengths (a few seconds): the median of their ratios counts
TYPICAL_CONTEXT = 256  # cached tokens of a typical chat turn, where no prompts say otherwise
# What the drafter's cost is measured on when --alpha spares the prompts: any text will do, as cost
# does not depend on what is drafted.
PROBE = "Explain in a few sentences why the sky is blue, and then why sunsets are red."


@user_errors
def predict_command(
    alpha: Annotated[Optional[float], typer.Option("--alpha", metavar="A", help="An acceptance rate you know (0 to 1), under the rule --accept names: nothing is sampled; the drafter's cost is measured on a built-in prompt.")] = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", metavar="FILE", help="Sample the acceptance rate from a few of your prompts (same format as calibrate-k's): each is answered plainly and at the largest K asked, under both lossless rules where they differ.")] = None,
    sample_size: Annotated[int, typer.Option("--sample", metavar="N", help="With --prompts: sample from N of its prompts, taken at even steps through the file (a file sorted by scenario gives each scenario its share).")] = 16,
    pair: PairOption = None,
    k: Annotated[str, typer.Option("--k", "-k", metavar="KS", help=f"K values to predict: a range like 1..8 or a list like 1,2,4 (1 to {MOST_K}: verify blocks are timed up to {MOST_K + 1} rows).")] = "1..8",
    context: Annotated[Optional[int], typer.Option("--context", metavar="N", help=f"Cached tokens the verify blocks are timed over. Default: with --prompts, the mean prompt plus half an answer, rounded to a power of two; else {TYPICAL_CONTEXT}.")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", metavar="N", help="Most new tokens per sampled answer: short answers keep the run under a minute.")] = 32,
    temperature: Annotated[float, typer.Option("--temperature", metavar="T", help="0 decodes greedily (both rules then keep the same drafts); above 0 samples, where the standard rule keeps more of a model's or head's drafts than the race.")] = 0.0,
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Random seed for sampling.")] = 0,
    accept: Annotated[str, typer.Option("--accept", metavar="RULE", help="With --alpha: the lossless rule it was measured under, exact (the race, the default) or standard (min(1, p/q)); the other rule's is derived from it. With --prompts both are measured.")] = EXACT,
    raw: RawOption = False,
    plot: Annotated[Optional[Path], typer.Option("--plot", metavar="FILE", help="Write a PNG of the predicted speed-up and the break-even acceptance against K (missing directories are created).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object on stdout instead of the table.")] = False,
    target: TargetOption = None,
    draft: DraftOption = None,
    drafter: DrafterOption = None,
    dtype: DtypeOption = None,
    models: ModelsOption = None,
    threads: ThreadsOption = None,
) -> None:
    """Predict the speed-up of each K on this machine before a long run.

    Times the target's verify curve (a block of K + 1 rows over one row, at --context cached tokens,
    each at the pair's padded length), answers a few prompts plainly and at the largest K with the
    drafter a run drives (--prompts, or a built-in prompt with --alpha), and prints per K the
    predicted speed-up (1 − α^(K+1)) / ((1 − α)(round(K) + K·c)), the break-even α at which K just
    pays, and the K it would choose, for both lossless rules. round(K) is the verify curve scaled to
    what the answered rounds paid, bookkeeping included, over a plain round; c the drafter's cost
    per drafted token. The formula assumes every round drafts K tokens: it understates a drafter
    that drafts only where it finds a match (lookup).

    Exit codes: 0 done; 2 bad input; 3 the result was printed but --plot could not be written.
    """
    if (alpha is None) == (prompts is None):
        raise UserError("give --alpha A (an acceptance rate you know) or --prompts FILE (a few prompts to sample it from), "
                        "one of them")
    check_number("--alpha", alpha, 0, 1)
    if prompts is not None:
        refuse_given(("accept",), "names the rule of --alpha; with --prompts both rules are measured")
    else:
        refuse_given(("sample_size",), "counts the prompts of --prompts; --alpha samples none")
    if accept not in RULES:
        raise UserError(f"--accept {accept!r}: predict covers the lossless rules, {' or '.join(RULES)}")
    check_count("--sample", sample_size, 1)
    check_count("--max-new-tokens", max_new_tokens, 1)
    check_count("--context", context, 1)
    check_seed(seed)
    check_threads(threads)
    sampling = sampling_params(temperature, 0, 1.0)
    ks = parse_ks(k)
    if plot:
        check_writable(plot, "--plot", ours=own_files.image)
        _check_plotting()
    items = spread(read_file(prompts), sample_size) if prompts is not None else []
    spec = resolve_pair(models, pair, target, draft, drafter, dtype)

    thread_policy.apply(threads)  # before torch loads
    from ..decoding.loaded_pair import load_pair
    from ..decoding.rules import AcceptRule
    from ..measure.acceptance_sample import sample
    from ..pairs.tokenization import encode_prompt

    console = stderr_console()
    interrupt.now("loading the pair")
    with console.status(f"loading {spec.name}…") if console.is_terminal else nullcontext():
        runtime = load_pair(spec)
    kind = spec.drafter.kind
    engine = runtime.engine  # the drafter a run drives: prompt lookup first where the pair puts it there
    encoded = [encode_prompt(runtime.tokenizer, item.text, raw) for item in items]
    check_fit(items, encoded, engine.context_length)
    holds = engine.context_length
    cached = _context(context, encoded, max_new_tokens, holds)

    interrupt.now("timing verify blocks")
    verify_costs = _verify_curve(runtime, cached, ks)
    differ = rules_differ(temperature, kind in (MODEL, HEAD))
    measured_rules = [AcceptRule(EXACT)] + ([AcceptRule(STANDARD)] if differ and prompts is not None else [])
    interrupt.now("sampling acceptance" if prompts is not None else "timing the drafter")
    runs = encoded or [encode_prompt(runtime.tokenizer, PROBE, raw)]
    with _progress(console, len(measured_rules) + 1) as report:
        sampled = sample(engine, runs, max(ks), measured_rules, max_new_tokens, sampling, seed, report)
    alphas = _alphas(alpha, accept, sampled if prompts is not None else None, differ)
    rounds = sampled.round_costs()
    curve = round_curve(verify_costs, rounds)
    per_rule = {rule: predict(value, sampled.c / rounds.plain, curve) for rule, (value, _) in alphas.items()}

    failed = False
    title = f"{spec.name} · {runtime.drafter.name} · {cached} cached tokens"
    if plot:
        from ..measure.plot import plot_prediction

        failed = not write_output("--plot", plot, lambda: plot_prediction(per_rule, {r: a for r, (a, _) in alphas.items()}, plot, title))
    result = _as_json(spec.name, runtime.drafter.name, cached, temperature, sampled, prompts is not None, verify_costs, rounds,
                      alphas, per_rule, differ)
    result["computed_by"] = runtime.target.computed_by()
    if json_out:
        print(json.dumps(result, ensure_ascii=False))
    else:
        _print(result, differ)
    if failed:
        raise typer.Exit(WRITE_FAILED)


def parse_ks(text: str) -> list[int]:
    """--k: the K values to predict, each from 1 to MOST_K."""
    try:
        ks = k_values(text)
    except ValueError as exc:
        raise UserError(f"--k {exc}") from None
    if any(not 1 <= value <= MOST_K for value in ks):
        raise UserError(f"--k values must be from 1 to {MOST_K} (verify blocks are timed up to {MOST_K + 1} rows); got {text!r}")
    return ks


def _context(given: int | None, encoded: list[list[int]], max_new_tokens: int, holds: int | None) -> int:
    """The cached tokens the verify curve is timed over: --context, else typical of the prompts, within
    what the target holds with the longest block after it."""
    most = holds - (MOST_K + 1) if holds else 1 << 20
    if given is not None:
        if given > most:
            raise UserError(f"--context {given}: the target holds {holds} tokens, so at most {most} with a block of "
                            f"{MOST_K + 1} after them")
        return given
    if encoded:
        return typical_context([len(ids) for ids in encoded], max_new_tokens, LEAST_CONTEXT, most)
    return min(TYPICAL_CONTEXT, most)


def _verify_curve(runtime, cached: int, ks: list[int]) -> dict[int, float]:
    """A block of K + 1 rows over one row, each run at the length the pair's padding plan runs it at.
    Timed afresh, each length's seconds over one row's within a pass and the median across
    VERIFY_REPS passes: a prediction is of this machine now, and a machine's speed drifts between
    passes (blocks.pass_ratios)."""
    from ..decoding.blocks import MEASURE_TRIES, block_passes, disturbed, fastest, pass_ratios
    from ..decoding.kv import input_device

    model = runtime.target.model
    device = input_device(model).type
    if device != "cpu":
        raise UserError(f"predict times verify blocks on a CPU target; this one runs on {device}")
    for _ in range(MEASURE_TRIES):
        passes = block_passes(model, MOST_K + 1, VERIFY_REPS, cached)
        if not disturbed(fastest(passes)):
            break
    else:
        raise UserError("the verify blocks' timings came out disordered three times (a busy machine): "
                        "run predict again when the machine is quieter")
    ratios, plan = pass_ratios(passes), runtime.block_plan
    one = ratios[plan.get(1, 1)]
    return {value: ratios[plan.get(value + 1, value + 1)] / one for value in ks}


def _alphas(given: float | None, rule: str, sampled, differ: bool) -> dict[str, tuple[float, str]]:
    """Per lossless rule, its acceptance and where it came from: given, measured, or derived from the
    other rule's (a bound: measure/prediction.py); the same figure for both where the rules do not differ."""
    if sampled is not None:
        exact = sampled.alpha(EXACT)
        if exact is None:
            raise UserError(f"the drafter drafted nothing on these {sampled.prompts} prompt(s): no acceptance to sample; "
                            "give prompts where it drafts, or --alpha")
        standard = sampled.alpha(STANDARD) if differ else exact
        return {EXACT: (exact, "measured"), STANDARD: (standard, "measured")}
    if not differ:
        return {EXACT: (given, "given"), STANDARD: (given, "given")}
    other = STANDARD if rule == EXACT else EXACT
    return {rule: (given, "given"), other: (other_rule_alpha(given, rule), f"derived from {rule}'s")}


def _as_json(pair, drafter, cached, temperature, sampled, from_prompts, verify_costs, rounds, alphas, per_rule, differ) -> dict:
    first = per_rule[EXACT]
    return {
        "pair": pair,
        "drafter": drafter,
        "context": cached,
        "temperature": temperature,
        "rules_differ": differ,
        "one_token_ms": round(sampled.one_token_s * 1000, 4),
        "c": round(sampled.c, 5),
        "verify_cost": {str(value): round(cost, 4) for value, cost in verify_costs.items()},
        "rounds": {"plain": round(rounds.plain, 4), "k": rounds.top_k,
                   "verify": None if rounds.top_verify is None else round(rounds.top_verify, 4), "other": round(rounds.other, 4)},
        "alpha": {rule: {"value": round(value, 4), "from": origin} for rule, (value, origin) in alphas.items()},
        "sampled": {"prompts": sampled.prompts, "k": sampled.k, "judged": {rule: counts.judged for rule, counts in sampled.counts.items()},
                    "plain_tokens_per_s": round(sampled.plain_tokens_per_s, 2)} if from_prompts else None,
        "per_k": [{"k": p.k, "verify_cost": round(verify_costs[p.k], 4), "round_cost": round(p.verify_cost, 4),
                   "break_even_alpha": None if p.break_even_alpha is None else round(p.break_even_alpha, 4),
                   "speedup": {rule: round(predictions[i].speedup, 4) for rule, predictions in per_rule.items()}}
                  for i, p in enumerate(first)],
        "choice": {rule: _choice(predictions) for rule, predictions in per_rule.items()},
    }


def _choice(predictions) -> dict:
    verdict = chosen(predictions)
    return {"k": verdict.k, "best_k": verdict.best_k, "speedup": round(verdict.speedup, 4), "verdict": verdict.verdict}


def _print(result: dict, differ: bool) -> None:
    console = plain_console()
    rules = list(RULES) if differ else [EXACT]
    greedy = "greedy" if result["temperature"] == 0 else f"temperature {result['temperature']:g}"
    console.print(f"{result['pair']} · drafter {result['drafter']} · {result['context']} cached tokens · {greedy}")
    console.print(f"one target token {result['one_token_ms']:.2f} ms; a drafted token costs {result['c']:.3f} of that (c)")
    rounds, timed = result["rounds"], result["verify_cost"][str(result["rounds"]["k"])]
    paid = (f"a round at K={rounds['k']} verified in {rounds['verify']:.2f} (timed alone {timed:.2f})" if rounds["verify"] is not None
            else f"no round drafted {rounds['k']} (the timed curve stands)")
    console.print(f"a plain round {rounds['plain']:.2f} of that; {paid}; a round's books {rounds['other']:.2f}: "
                  "`round` is the timed curve scaled to the rounds, over a plain round")
    for rule in rules:
        figure = result["alpha"][rule]
        where = figure["from"]
        if where == "measured":
            sampled = result["sampled"]
            where = f"measured at K={sampled['k']} on {sampled['prompts']} prompt(s), {sampled['judged'][rule]} drafts judged"
        elif where.startswith("derived"):
            where += " (at least (1 − TV)/(1 + TV) where standard keeps 1 − TV)" if rule == EXACT else \
                " (at most 2α/(1 + α) where the race keeps α)"
        both = "" if differ else f"; {'greedy' if result['temperature'] == 0 else 'one-hot drafts'}: the same under both rules"
        console.print(f"α {figure['value']:.3f} under {rule}, {where}{both}")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("K", "verify", "round", "break-even α", *(f"speed-up {rule}" if differ else "speed-up" for rule in rules), ""):
        table.add_column(column, justify="left" if not column else "right")
    top = max(row["speedup"][EXACT] for row in result["per_k"])
    for row in result["per_k"]:
        even = row["break_even_alpha"]
        speeds = [row["speedup"][rule] for rule in rules]
        table.add_row(str(row["k"]), f"{row['verify_cost']:.2f}", f"{row['round_cost']:.2f}", "never" if even is None else f"{even:.2f}",
                      *(f"{s:.2f}×" for s in speeds), _bar(speeds[0], top))
    console.print(table)
    for rule in rules:
        choice = result["choice"][rule]
        advice = (f"K={choice['best_k']}, {choice['speedup']:.2f}× predicted" if choice["verdict"] == "speculate"
                  else f"plain decoding: the best K ({choice['best_k']}) is predicted at {choice['speedup']:.2f}×")
        console.print(f"{rule}: {advice}")


def _bar(value: float, top: float, width: int = 24) -> str:
    """A speed-up as a bar scaled to the largest shown (or to 1×), with a mark where plain decoding's 1× falls."""
    scale = max(top, 1.0)
    cells, one = round(width * value / scale), round(width / scale)
    return "".join("█" if i < cells else "|" if i == one else " " for i in range(width + 1)).rstrip()


def _progress(console, runs_per_prompt: int):
    """One plain line on stderr per finished prompt (the sampling is short: no bar)."""
    def report(done: int, total: int) -> None:
        if done % runs_per_prompt == 0 or done == total:
            console.print(f"specdec predict: {done}/{total} runs")

    return nullcontext(report)
