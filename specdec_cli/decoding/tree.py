"""Token trees: verify several candidate continuations in one target forward, keep the best path.

A round's block is the root (the last emitted token, block index 0) followed by the draft nodes
(block indices 1..N). ``parents[i]`` is the block index of node i's parent, so ``parents[0]`` is -1
and every parent comes before its children. Each node attends to the cache and to its ancestors
only, and sits at position ``cached + depth``: a path through the tree is then computed exactly as
if it had been fed alone, and after compaction its keys need no re-rotation.

Acceptance follows the module ``acceptance`` convention: **p is the target's distribution**. At
each node reached, the target's own token is its choice there (the argmax, or under sampling the
race's winner under the noise of that position: coupling.py); the child holding that token, if any,
is kept and the walk goes on from it. Under sampling a child x is then kept with chance p(x), as
under the point-mass rule (recursive rejection with one-hot proposals), and the text is the one
plain decoding samples under the same seed. ``min(1, p/q)`` with the draft's q would not be
lossless, for candidates that were not sampled from q.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch


@dataclass(frozen=True)
class Tree:
    """The block of one tree round: ``tokens[0]`` is the root, ``parents[0] == -1``."""

    tokens: torch.Tensor
    parents: tuple[int, ...]

    def __post_init__(self):
        if len(self.parents) != self.tokens.shape[0] or self.parents[0] != -1:
            raise ValueError("a tree needs one parent per token and the root first")
        if any(not 0 <= parent < i for i, parent in enumerate(self.parents) if i):
            raise ValueError("every parent must come before its child")

    @classmethod
    def chain(cls, tokens: torch.Tensor) -> "Tree":
        """A chain of drafts after the root: the tree of width 1."""
        return cls(tokens, tuple(range(-1, tokens.shape[0] - 1)))

    def __len__(self) -> int:
        return len(self.parents)

    def children(self, node: int) -> list[int]:
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def ancestors(self) -> torch.Tensor:
        """[N, N] bool: row i marks i and every ancestor of i."""
        seen = torch.eye(len(self), dtype=torch.bool)
        for i, parent in enumerate(self.parents):
            if parent >= 0:
                seen[i] |= seen[parent]
        return seen

    def depths(self) -> torch.Tensor:
        return self.ancestors().sum(1) - 1

    def path_to(self, node: int) -> list[int]:
        return path_to(self.parents, node)


def path_to(parents: Sequence[int], node: int) -> list[int]:
    """``node`` and its ancestors, root first, in a forest given by ``parents`` (-1: a root): the
    nodes it may see. A tree's (Tree.path_to) and the draft head's candidates' (head.propose_tree)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def attention_mask(tree: Tree, cached: int, dtype: torch.dtype = torch.bool, window: int | None = None) -> torch.Tensor:
    """[1, 1, N, cached + N]: every node sees the cache and its ancestors; with a sliding ``window``,
    only those less than ``window`` positions back (a node's position is cached + its depth), as a
    sliding-window layer sees them.

    Bool (True = attend) for SDPA; a float dtype gives the additive form eager attention needs (a
    bool mask there is silently added as 0/1 and gives wrong logits).
    """
    seen = torch.cat([torch.ones(len(tree), cached, dtype=torch.bool), tree.ancestors()], dim=1)
    if window is not None:
        rows = cached + tree.depths()
        columns = torch.cat([torch.arange(cached), rows])
        seen &= (rows[:, None] - columns[None, :]) < window
    if dtype == torch.bool:
        return seen[None, None]
    return torch.zeros(seen.shape, dtype=dtype).masked_fill(~seen, torch.finfo(dtype).min)[None, None]


def tree_masks(config, tree: Tree, cached: int, dtype: torch.dtype = torch.bool):
    """The tree's mask for a model of ``config``: one mask where every layer attends alike; where some
    layers slide a window and others see everything (Gemma 2 and 3), one mask per kind of layer, as
    transformers takes them (a mapping by layer type). A mask handed to a forward is used as given, so
    the window must be in it."""
    text = config.get_text_config()
    window = getattr(text, "sliding_window", None)
    types = set(getattr(text, "layer_types", None) or (["sliding_attention"] if window else ["full_attention"]))
    full = attention_mask(tree, cached, dtype)
    if not window or "sliding_attention" not in types:
        return full
    sliding = attention_mask(tree, cached, dtype, window)
    return sliding if types == {"sliding_attention"} else {"full_attention": full, "sliding_attention": sliding}


def greedy_tree_accept(tree: Tree, target_logits: torch.Tensor) -> tuple[list[int], int]:
    """The longest root-to-node path whose every token is the target's argmax after its parent.

    Returns the accepted nodes (block indices, root excluded) and the target's next token after the
    last of them. Row i of ``target_logits`` scores the position after node i: logits under greedy
    decoding, the race's scores under sampling.
    """
    choice = target_logits.argmax(dim=-1).tolist()
    path, node = [], 0
    while True:
        match = next((c for c in tree.children(node) if int(tree.tokens[c]) == choice[node]), None)
        if match is None:
            return path, choice[node]
        path.append(match)
        node = match


@dataclass(frozen=True)
class TreeShape:
    """How a drafter grows a tree: at most ``nodes`` nodes, ``width`` children per expanded node and
    nodes expanded per level, ``depth`` levels. The budget is ``nodes``; width and depth bound the work."""

    nodes: int
    width: int = 4  # measured on the shipped head: at 8 nodes width 4 kept more per round than 2 or 3
    depth: int = 5


def best_nodes(scores: list[float], parents: list[int], n: int) -> list[int]:
    """The ``n`` candidates with the highest cumulative log-probability, in creation order.

    ``parents[i]`` is the candidate index of i's parent (-1 the root), created before i; a score
    never rises from parent to child, and ties go to the earlier, so the choice is ancestor-closed:
    EAGLE-2's rerank, which is the tree of highest expected accepted length under the draft's beliefs.
    """
    finite = [i for i, score in enumerate(scores) if score > float("-inf")]
    chosen = sorted(sorted(finite, key=lambda i: (-scores[i], i))[:n])
    kept = set(chosen)
    assert all(parents[i] < 0 or parents[i] in kept for i in chosen), "a chosen node's parent was left out"
    return chosen


Rate = Callable[[int, int], float]  # (depth, sibling rank) → chance a node is kept, given its parent was


def shape_of(parents: Sequence[int]) -> tuple[list[int], list[int]]:
    """Each block index's depth (the root 0) and rank among its parent's children (in block order,
    which is a drafter's order of preference: top-1 first)."""
    depths, ranks, seen = [], [], {}
    for parent in parents:
        depths.append(0 if parent < 0 else depths[parent] + 1)
        ranks.append(seen.get(parent, 0))
        seen[parent] = ranks[-1] + 1
    return depths, ranks


def expected_accepted(parents: Sequence[int], rate: Rate) -> float:
    """Tokens a round with this tree emits on average: 1 + Σ over nodes of Π along the path to it.

    Under sampling (and greedy) a node is kept with the chance the target picks its token,
    so a node's path probability is its parent's times ``rate(depth, rank)``.
    """
    depths, ranks = shape_of(parents)
    along = [1.0] * len(parents)
    for i, parent in enumerate(parents):
        if parent >= 0:
            along[i] = along[parent] * rate(depths[i], ranks[i])
    return sum(along)


def judgements(parents: Sequence[int], path: Sequence[int], complete: bool) -> list[tuple[int, int, bool]]:
    """What a tree round taught, as (depth, rank, kept) per child the target judged.

    At each node the path reached, every child was judged: the kept one is the target's pick, so no
    other child was (the target picks one token there: its argmax, or under sampling the race's
    winner). The last node's children all
    lost, unless EOS or the budget cut the round before they were judged (``complete`` False).
    """
    depths, ranks = shape_of(parents)
    reached = [0, *path] if complete else [0, *path[:-1]]
    kept = set(path)
    return [(depths[child], ranks[child], child in kept)
            for node in reached for child in range(len(parents)) if parents[child] == node]


def best_first(rate: Rate, nodes: int, width: int, depth: int) -> list[tuple[float, int, int]]:
    """The best tree of at most ``nodes`` nodes under ``rate``, as (path probability, parent, depth)
    per node in the order taken; every prefix of it is the best tree of its size.

    Best-first over the tree of ``width`` children per node and ``depth`` levels: the nodes of highest
    path probability, which is what a drafter's rerank aims at. A node's next sibling becomes a
    candidate only once the node is taken, so the tree holds ranks in order, as a drafter's does.
    Parents are block indices (0 the root, i the i-th node taken).
    """
    taken: list[tuple[float, int, int]] = []
    order = itertools.count()  # ties go to the candidate pushed first: the shallower, the better-ranked
    heap: list[tuple[float, int, int, int, int, float]] = []  # (-value, order, parent, depth, rank, parent's value)

    def push(parent: int, level: int, rank: int, base: float) -> None:
        if level <= depth and rank < width:
            value = base * min(max(rate(level, rank), 0.0), 1.0)
            heapq.heappush(heap, (-value, next(order), parent, level, rank, base))

    push(0, 1, 0, 1.0)
    while heap and len(taken) < nodes:
        value, _, parent, level, rank, base = heapq.heappop(heap)
        taken.append((-value, parent, level))
        push(len(taken), level + 1, 0, -value)
        push(parent, level, rank + 1, base)
    return taken


def expected_tree(rate: Rate, nodes: int, width: int, depth: int) -> tuple[float, list[int]]:
    """The best tree of at most ``nodes`` nodes under ``rate``: its expected tokens per round, and its
    parents (block indices, the root first)."""
    taken = best_first(rate, nodes, width, depth)
    return 1.0 + sum(value for value, _, _ in taken), [-1, *(parent for _, parent, _ in taken)]


def verify_tree(model, cache, tree: Tree, device: torch.device, **extra):
    """One target forward over the whole tree; ``out.logits[0, i]`` scores the children of node i."""
    cached = cache.get_seq_length()
    eager = getattr(model.config, "_attn_implementation", None) == "eager"
    masks = tree_masks(model.config, tree, cached, model.dtype if eager else torch.bool)
    masks = {kind: m.to(device) for kind, m in masks.items()} if isinstance(masks, dict) else masks.to(device)
    positions = (cached + tree.depths())[None]
    return model(
        tree.tokens[None].to(device), cache=cache, use_cache=True, attention_mask=masks,
        position_ids=positions.to(device), **extra,
    )
