"""Prompts of one batch that begin alike compute their common beginning once: a joining prompt copies
the cached keys and values of a running answer whose tokens start the same (vLLM's automatic prefix
caching, within the batch), and its forward computes only the rest.

This keeps every answer its own plain decoding's, bit for bit, because a copied position holds what
the joining prompt's own forward would have put there: on specdec's kernels a position's keys and
values depend only on the tokens up to it, as long as every forward attends it row by row. A prompt's
positions below the lean forward's ``rowwise_up_to`` always are (lean_forward.is_prompt), and a
prefix is shared up to the position before it (``prefix_up_to``, which says why). A drafter that
reads the target's features gets the source's for the copied positions, which are the same bits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .drafters.base import common_prefix

if TYPE_CHECKING:
    from .request import Request

# Rows a joining prompt must gain, by waiting one step for a prompt that joins in this one, to wait:
# its answer then starts a step later, which costs it latency and the batch nothing.
DEFER_FROM = 32


def shared_length(request: Request, source: Request, limit: int) -> int:
    """The prompt positions ``request`` may copy from ``source``'s cache: their prompts' common
    beginning among the positions a prompt caches (all but its last token), at most ``limit``."""
    return min(common_prefix(request.tokens[: request.prompt_length - 1], source.tokens[: source.prompt_length - 1]), limit)


def best_source(request: Request, candidates: list[Request], limit: int) -> tuple[Request | None, int]:
    """The candidate ``request`` shares the most positions with, and how many (None, 0: none)."""
    found: tuple[Request | None, int] = (None, 0)
    for candidate in candidates:
        length = shared_length(request, candidate, limit)
        if length > found[1]:
            found = (candidate, length)
    return found


def plan_sharing(joining: list[Request], cached: list[Request], limit: int) -> list[tuple[Request, Request | None, int]]:
    """The prompts that join this step's forward, in order, each with the cached answer it copies from
    and how many positions (None, 0: it computes all). A prompt that would gain ``DEFER_FROM`` positions
    or more from one joining in this step waits for the next, when that one is cached; it is left out."""
    now: list[tuple[Request, Request | None, int]] = []
    for request in joining:
        source, length = best_source(request, cached, limit)
        if best_source(request, [r for r, _, _ in now], limit)[1] >= length + DEFER_FROM:
            continue
        now.append((request, source, length))
    return now


def copy_prefix(source, cache, length: int) -> None:
    """Fill the empty ``cache`` with the first ``length`` positions of ``source``'s, layer by layer."""
    for index, layer in enumerate(source.layers):
        cache.update(layer.keys[..., :length, :], layer.values[..., :length, :], index)
