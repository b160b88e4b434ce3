"""Verify-block padding: on some CPUs a longer forward is cheaper than a shorter one.

BLAS libraries pick different matrix kernels by row count, so a forward's cost need not grow with
its tokens: on this project's first 2-core CPU (SmolLM2-135M, float32) verifying 2 tokens was dearer
than verifying 5 (docs/notebook.md, "Figures that were in the code's docstrings"). Padding a block
with dummy tokens after the real ones changes nothing for the real positions (attention is causal,
and the padded cache entries are cropped with the rejected drafts), so a block of n is run at the
cheapest length m ≥ n. The costs are measured once per machine, model, library versions and
forward code, and kept in the cache directory.

A block's cost also grows with the context it attends over, and by more than a one-token forward's
(each row reads the whole cache; docs/notebook.md, "A verify block's cost by its context"). So the
adaptive controller is also given what each block length adds per cached token
(``context_slopes``), from a measurement over a short and a long context, taken once, where it is
first needed.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..notices import log
from ..pairs.cache_dir import transformers_version, unwritable
from ..pairs.manifest import cpu_name
from .kv import context_length, crop_cache, input_device, reserved_cache
from .tree import Tree

if TYPE_CHECKING:
    from transformers import PreTrainedModel

MEASURED_LENGTHS = 10  # blocks of 1..10 tokens: K up to 9, where speculation on a CPU can pay
MEASURE_TRIES = 3  # measurements before giving up on a busy machine (``disturbed``)
SHORT_CONTEXT = 64  # cached tokens the padding plan is measured over
LONG_CONTEXT = 1024  # and the second measurement, for what a cached token adds (``context_slopes``)


def block_plan(costs: dict[int, float]) -> dict[int, int]:
    """The padding plan: for each measured block length n, the cheapest length m ≥ n to run it at.

    Only a clear saving counts (5%): timing noise must not pad blocks for nothing.
    """
    lengths = sorted(costs)
    chosen = {}
    for n in lengths:
        best = n
        for m in lengths:
            if m > n and costs[m] < 0.95 * costs[best]:
                best = m
        chosen[n] = best
    return chosen


def padded_chain(block: torch.Tensor, length: int) -> torch.Tensor:
    """A chain's block run at ``length``: lengthened with copies of its last token. The padding sits
    after every real position, so causal attention keeps it out of their logits; its cache entries
    are cropped with the rejected drafts."""
    if length <= block.shape[0]:
        return block
    return torch.cat([block, block[-1:].expand(length - block.shape[0])])


def padded_tree(tree: Tree, length: int) -> Tree:
    """A tree's block run at ``length``: copies of the root hung under it. No real node sees them
    (the mask shows a node only its ancestors), acceptance reads the real nodes alone, and their cache
    entries are dropped with the rest of the unaccepted tree."""
    if length <= len(tree):
        return tree
    extra = length - len(tree)
    return Tree(torch.cat([tree.tokens, tree.tokens[:1].expand(extra)]), tree.parents + (0,) * extra)


@torch.inference_mode()
def time_blocks(model: PreTrainedModel, lengths: int = MEASURED_LENGTHS, reps: int = 5,
                context: int = SHORT_CONTEXT) -> dict[int, float]:
    """Seconds of a forward of n tokens over a cached context, for n = 1..lengths, interleaved: the
    fastest of ``reps``, since other work on the machine only ever adds time."""
    return fastest(block_passes(model, lengths, reps, context))


def fastest(passes: list[dict[int, float]]) -> dict[int, float]:
    """Each length's fastest seconds over the passes: other work on the machine only ever adds time."""
    return {n: min(times[n] for times in passes) for n in passes[0]}


def pass_ratios(passes: list[dict[int, float]]) -> dict[int, float]:
    """Each length's seconds over one token's, taken within each pass and the median across passes:
    a machine whose speed drifts between passes (clocks, neighbours) moves a pass's lengths alike, so
    the ratios hold where each length's fastest, taken from different passes, would not."""
    return {n: statistics.median(times[n] / times[1] for times in passes) for n in passes[0]}


def block_passes(model: PreTrainedModel, lengths: int, reps: int, context: int) -> list[dict[int, float]]:
    """``reps`` passes, each timing a forward of every length 1..lengths over ``context`` cached
    tokens, one after the other; a first pass warms every shape up and is left out."""
    device = input_device(model)
    vocab = model.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    cache = reserved_cache(model.config)  # as the engine's
    model(torch.randint(vocab, (1, context), generator=generator).to(device), cache=cache, logits_to_keep=1)
    passes = []
    for _ in range(reps + 1):
        times = {}
        for n in range(1, lengths + 1):
            block = torch.randint(vocab, (1, n), generator=generator).to(device)
            started = time.perf_counter()
            model(block, cache=cache, use_cache=True, logits_to_keep=n)
            times[n] = time.perf_counter() - started
            crop_cache(cache, context)
        passes.append(times)
    return passes[1:]


def disturbed(costs: dict[int, float]) -> bool:
    """Did something else on the machine skew the measurement? A plan that pads one-token forwards
    (a longer block clearly cheaper than one token) is what a busy machine produces, never a CPU:
    kept, it would slow every token of plain decoding and tell the controller drafting is free."""
    return block_plan(costs).get(1, 1) != 1


def relative_costs(costs: dict[int, float], chosen: dict[int, int]) -> dict[int, float]:
    """Verify cost of K drafts (a block of K + 1, run at its planned length) over a one-token
    block's: what the adaptive controller starts from for block sizes it has not timed yet."""
    one = costs.get(chosen.get(1, 1))
    if not one:
        return {}
    return {n - 1: costs[chosen.get(n, n)] / one for n in sorted(costs) if n > 1}


def context_slopes(short: dict[int, float], long: dict[int, float], chosen: dict[int, int],
                   contexts: tuple[int, int] = (SHORT_CONTEXT, LONG_CONTEXT)) -> dict[int, float]:
    """Seconds each cached token adds to a block of K + 1 tokens (run at its planned length), by K
    (0: a one-token forward), from the costs over two contexts; never below 0, which only timing
    noise gives. Keyed as ``relative_costs`` is, plus K = 0."""
    gap = contexts[1] - contexts[0]
    lengths = {n: chosen.get(n, n) for n in short}
    return {n - 1: max(0.0, (long[m] - short[m]) / gap) for n, m in lengths.items() if m in short and m in long}


def cached_context_slopes(model: PreTrainedModel, identity: str, cache_dir, chosen: dict[int, int]) -> dict[int, float]:
    """``context_slopes`` for this model on this machine: the block costs over SHORT_CONTEXT and over
    ``long_context`` measured one after the other on first use (a few seconds), both kept, so that
    the machine's speed that day cancels out; {} where there is no long context or no measurement."""
    context = long_context(model)
    if context is None:
        return {}
    short = cached_costs(model, identity, cache_dir, SHORT_CONTEXT, beside=context)
    long = cached_costs(model, identity, cache_dir, context, beside=SHORT_CONTEXT, said=False) if short else {}
    return context_slopes(short, long, chosen, (SHORT_CONTEXT, context)) if long else {}


def cached_block_plan(model: PreTrainedModel, identity: str, cache_dir) -> dict[int, int]:
    """The padding plan for this model on this machine, measured on first use (a few seconds).

    Accelerators do not show the effect and are left alone: the plan is the identity there.
    """
    return block_plan(cached_costs(model, identity, cache_dir))


def forward_code() -> str:
    """A digest of this package's code that shapes a target forward (quantised linears, fused
    projections, row-by-row attention, the lean forward, the KV cache): costs measured under other
    code are stale."""
    from ..runtime import fused_projections, lean_forward, native_kernels, quantize, rowwise_attention
    from . import kv

    digest = hashlib.sha256()
    for module in (fused_projections, lean_forward, native_kernels, quantize, rowwise_attention, kv):
        digest.update(Path(module.__file__).read_bytes())
    for source in native_kernels.sources():
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def read_costs(path: Path) -> dict[int, float]:
    """The costs in a block-cost file, exactly as ``cached_costs`` writes them: lengths 1..n, each a
    positive, finite number of seconds. specdec owns the file, so anything else in it is a
    ``ValueError`` saying what (measured again), never a traceback on every run."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("not JSON") from None
    if not isinstance(saved, dict) or not saved:
        raise ValueError(f"{type(saved).__name__}, not a mapping of block lengths to seconds")
    if set(saved) != {str(n) for n in range(1, len(saved) + 1)}:
        raise ValueError(f"its block lengths are not 1 to {len(saved)}")
    for seconds in saved.values():
        if type(seconds) not in (int, float) or not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"a cost of {json.dumps(seconds)}, not a positive number of seconds")
    return {int(n): float(s) for n, s in saved.items()}


def long_context(model: PreTrainedModel) -> int | None:
    """The context of the second measurement: LONG_CONTEXT, or as long as the model holds with the
    longest block after it; None where that is not clearly longer than SHORT_CONTEXT (tiny models)."""
    holds = context_length(model) or LONG_CONTEXT + MEASURED_LENGTHS
    context = min(LONG_CONTEXT, holds - MEASURED_LENGTHS)
    return context if context >= 4 * SHORT_CONTEXT else None


def cached_costs(model: PreTrainedModel, identity: str, cache_dir, context: int = SHORT_CONTEXT,
                 beside: int | None = None, said: bool = True) -> dict[int, float]:
    """Seconds of a block of each length over ``context`` cached tokens for this model on this
    machine (see cached_block_plan); {} off a CPU. ``beside``: the measurement taken with the one over that
    other context (cached_context_slopes), kept apart from the padding plan's. A measurement is said in
    one line (``said``: the pair's second half says nothing, its first said both)."""
    if input_device(model).type != "cpu":
        return {}
    head = model.get_output_embeddings()  # which kernels: torch's (Int4Linear, Int8Linear) or specdec's (Q8Linear)
    key = "|".join([identity, str(model.dtype), type(head).__name__, torch.__version__, transformers_version(),
                    str(torch.get_num_threads()), cpu_name(), forward_code()])
    if (context, beside) != (SHORT_CONTEXT, None):  # the padding plan's file keeps the name it had
        key += f"|context {context}" + (f" beside {beside}" if beside is not None else "")
    path = cache_dir / f"block-costs-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    try:
        costs = read_costs(path)
    except FileNotFoundError:
        costs = {}
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        log.warning(f"the block costs in {path} are unusable ({reason}): measuring them again")
        costs = {}
    if not costs or disturbed(costs):  # disturbed: kept by an earlier version, which saved whatever it measured
        if said:
            over = f"over {context} and {beside} cached tokens" if beside is not None else f"of 1 to {MEASURED_LENGTHS} tokens"
            log.info(f"timing verify blocks {over} on this machine (once: kept in {cache_dir})")
        for _ in range(MEASURE_TRIES):
            costs = time_blocks(model, context=context)
            if not disturbed(costs):
                break
        else:
            return {}  # nothing to trust: no padding, and the controller times blocks itself
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(costs))
        except OSError as exc:  # read-only, full, another user's: measured again at the next start
            log.warning(f"the block costs are not kept, so they are measured again at every start: {unwritable(path, exc)}")
    return costs

