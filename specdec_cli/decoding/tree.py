"""Token trees: verify several candidate continuations in one target forward, keep the best path.

A round's block is the root (the last emitted token, block index 0) followed by the draft nodes
(block indices 1..N). ``parents[i]`` is the block index of node i's parent, so ``parents[0]`` is -1
and every parent comes before its children. Each node attends to the cache and to its ancestors
only, and sits at position ``cached + depth``: a path through the tree is then computed exactly as
if it had been fed alone, and after compaction its keys need no re-rotation.

Acceptance follows the module ``acceptance`` convention: **p is the target's distribution**. The
children of a node are deterministic candidates (top-k of the draft, lookup matches), so sampling
uses the point-mass rule: try the children in order, accept child x with probability p(x), on a
rejection set p(x) = 0 and renormalise; when every child is rejected, sample from what is left of p.
This is recursive rejection sampling with a one-hot proposal, exactly lossless; ``min(1, p/q)`` with
the draft's q is not, for candidates that were not sampled from q.
"""

from __future__ import annotations

from dataclasses import dataclass

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
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


def attention_mask(tree: Tree, cached: int, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """[1, 1, N, cached + N]: every node sees the cache and its ancestors.

    Bool (True = attend) for SDPA; a float dtype gives the additive form eager attention needs (a
    bool mask there is silently added as 0/1 and gives wrong logits).
    """
    seen = torch.cat([torch.ones(len(tree), cached, dtype=torch.bool), tree.ancestors()], dim=1)
    if dtype == torch.bool:
        return seen[None, None]
    return torch.zeros(seen.shape, dtype=dtype).masked_fill(~seen, torch.finfo(dtype).min)[None, None]


def greedy_tree_accept(tree: Tree, target_logits: torch.Tensor) -> tuple[list[int], int]:
    """The longest root-to-node path whose every token is the target's argmax after its parent.

    Returns the accepted nodes (block indices, root excluded) and the target's next token after the
    last of them. Row i of ``target_logits`` scores the position after node i.
    """
    choice = target_logits.argmax(dim=-1).tolist()
    path, node = [], 0
    while True:
        match = next((c for c in tree.children(node) if int(tree.tokens[c]) == choice[node]), None)
        if match is None:
            return path, choice[node]
        path.append(match)
        node = match


def tree_sample_accept(
    tree: Tree, p: torch.Tensor, generator: torch.Generator | None = None
) -> tuple[list[int], int]:
    """Sampling acceptance over deterministic children (point-mass rule); rows of ``p`` as for greedy."""
    path, node = [], 0
    while True:
        row = p[node].clone()
        chosen = None
        for child in tree.children(node):
            x = int(tree.tokens[child])
            total = row.sum()
            if total <= 0:
                break
            if float(torch.rand((), generator=generator, device=row.device)) < float(row[x] / total):
                chosen = child
                break
            row[x] = 0.0
        if chosen is None:
            row = row if row.sum() > 0 else p[node]
            return path, int(torch.multinomial(row / row.sum(), 1, generator=generator))
        path.append(chosen)
        node = chosen


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


def verify_tree(model, cache, tree: Tree, device: torch.device, **extra):
    """One target forward over the whole tree; ``out.logits[0, i]`` scores the children of node i."""
    cached = cache.get_seq_length()
    eager = getattr(model.config, "_attn_implementation", None) == "eager"
    mask = attention_mask(tree, cached, model.dtype if eager else torch.bool)
    positions = (cached + tree.depths())[None]
    return model(
        tree.tokens[None].to(device), cache=cache, use_cache=True, attention_mask=mask.to(device),
        position_ids=positions.to(device), **extra,
    )
