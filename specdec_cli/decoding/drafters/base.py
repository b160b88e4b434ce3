"""What every drafter is: whatever proposes the next K tokens for the target to judge.

One small interface (``propose``, ``observe`` and ``reset``), modelled on transformers'
CandidateGenerator. A drafter may return fewer tokens than asked for (n-gram lookup finds no match,
say); the engine then verifies what it got. Which tokens survive is never the drafter's business;
what the target said of them, every drafter sees (``observe``), and the ones that learn learn from it.
"""

from __future__ import annotations

import copy

from dataclasses import dataclass

import torch

from ..acceptance import SamplingParams, distribution
from ..control.gate import DraftGate, confidence
from ..coupling import PositionNoise, race_winner
from ..tree import TreeShape


@dataclass
class Draft:
    """Proposed token ids, and q: the draft distribution each was drawn from.

    ``probs`` is None for a deterministic drafter (one-hot q); greedy decoding never reads it.
    ``parents`` is None for a chain; for a tree (decoding/tree.py) it gives each token's parent as a
    block index: 0 is the root (the last context token), j + 1 is draft token j, parents come first.
    A tree's tokens are deterministic candidates (top-k), so it carries no q.
    """

    tokens: torch.Tensor
    probs: torch.Tensor | None = None
    source: str = ""  # which drafter proposed it (lookup.lookup_source(n), "head", "model"): the controller's key
    catchup_s: float = 0.0  # of the drafting time, a head's catch-up on positions confirmed while it sat out
    parents: tuple[int, ...] | None = None
    # Under a gate (gate.py): the drafter's confidence at each position it weighed, one past the
    # last token when the gate stopped it there; its length is the drafter steps the draft took.
    confidence: list[float] | None = None

    @classmethod
    def empty(cls) -> "Draft":
        return cls(torch.empty(0, dtype=torch.long))

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def first(self, n: int) -> "Draft":
        """A chain's first ``n`` tokens, with their q and everything else the draft said of itself."""
        return Draft(self.tokens[:n], None if self.probs is None else self.probs[:n], self.source, self.catchup_s,
                     confidence=self.confidence)


@dataclass
class Verified:
    """What a round (or the prompt) showed the drafters: the engine hands it to ``Drafter.observe``.

    ``context``: every token so far, the round's emitted ones included (1-D, CPU). ``block``: the
    tokens the target scored in the round's forward (the root first; a tree's nodes in block order),
    and ``successors`` the target's top ids after each of them, best first (rows × ``Needs.successors``;
    None when no drafter asked). ``features``: the target's features of the positions that became
    confirmed (the layers in ``Needs.features``; None when no drafter reads them). ``finished``: the answer is complete;
    ``prompt_length`` says where it began.
    """

    context: torch.Tensor
    prompt_length: int
    block: torch.Tensor | None = None
    successors: torch.Tensor | None = None
    features: torch.Tensor | None = None
    finished: bool = False


def top_ids(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` highest-scoring ids of each row, best first. One id by numpy's argmax: on a few rows
    of a large vocabulary torch's argmax and topk cost several times more, added to every round
    (benchmarks/free_drafter_bookkeeping.py; docs/notebook.md, "Figures that were in the code's
    docstrings")."""
    if k == 1:
        return torch.from_numpy(logits.numpy().argmax(-1)[:, None])
    return torch.topk(logits, k).indices


@dataclass(frozen=True)
class Needs:
    """What a drafter reads of the target's forward beyond the tokens, declared once: the engine
    computes it for every drafter that asks and hands it over in ``Verified``.

    ``features``: the target's hidden states it drafts on (indices into transformers'
    ``hidden_states``: -1 the last, post-norm), concatenated, for every position that became
    confirmed, in cache order; empty: none (plain decoding and the other drafters pay nothing).
    ``successors``: how many of the target's top ids after each verified row (0: none).
    """

    features: tuple[int, ...] = ()
    successors: int = 0

    @classmethod
    def union(cls, needs) -> Needs:
        """What a drafter made of others needs: the features of the first part that reads any (one
        head per drafter), the most successors any part asks for."""
        needs = tuple(needs)
        return cls(next((n.features for n in needs if n.features), ()), max((n.successors for n in needs), default=0))


class Drafter:
    """What every drafter is: ``name``, ``reset``, ``observe`` and ``propose``; the optional parts
    are declared here with their defaults, and a drafter that has them overrides them (no attribute
    is probed for).

    ``free``: its draft costs nothing to find (a lookup in a table), so a schedule that weighs
    drafters is shown it every round before it decides; a drafter that is not free (a model, a
    head) costs a forward per token and drafts only when chosen. ``needs``: what it reads of the
    target's forward (``Needs``: features, successors). ``for_pair``: how a free kind's line in
    pairs/free_kinds.py builds it (decoding/loaded_pair.py calls it on every free kind). Trees are
    protocols of their own: ``TreeDrafting`` (drafts a tree when asked), ``TreesOnly`` (drafts
    nothing but trees).
    """

    name: str
    free: bool = False
    needs: Needs = Needs()

    @classmethod
    def for_pair(cls, spec, vocab_size: int) -> Drafter:
        """The drafter a pair's ``spec`` (pairs/registry.DrafterSpec) names, for a target of ``vocab_size``
        ids: what a free kind defines, so that its line in pairs/free_kinds.py can build it."""
        raise TypeError(f"{cls.__module__}.{cls.__qualname__} defines no for_pair(spec, vocab_size), "
                        "so no line in pairs/free_kinds.py can build it")

    def reset(self) -> None:
        """Forget the previous prompt (what a drafter learns across prompts, it keeps)."""

    def fork(self) -> Drafter:
        """A drafter for another answer decoded beside this one's (batched decoding): state of its own
        for the answer, what it learns across answers shared. By default a shallow copy that ``reset``
        gives answer state of its own; a drafter whose state is all learned across answers (a table,
        a memory) is shared whole, and a composite forks its parts."""
        twin = copy.copy(self)
        twin.reset()
        return twin

    def observe(self, verified: Verified) -> None:
        """See what the target confirmed and predicted (and, for a drafter that needs them, the
        successors and features it declared)."""

    def propose(
        self, context: torch.Tensor, k: int, sampling: SamplingParams, noise: PositionNoise | None,
        gate: DraftGate | None = None,
    ) -> Draft:
        """Up to ``k`` tokens that might follow ``context`` (1-D token ids, CPU). ``noise``: under
        sampling, the race's noise of the target's positions (coupling.py), which a drafter that
        samples from q of its own draws under, so that its draft is the target's choice as often as
        it can be. ``gate``: a drafter with
        a distribution of its own (a model, a head) stops drafting where the gate finds its next guess
        not worth verifying (possibly before the first); one without (lookup, a tree) has no guess to
        weigh and drafts as it would."""
        raise NotImplementedError

    def parts(self) -> tuple[tuple["Drafter", ...], "Drafter | None"]:
        """(free drafters, learned drafter): what a schedule that weighs drafters chooses among. A free
        drafter's draft is shown to it every round; a model or head is asked only when chosen. By
        default a drafter is one or the other, whole."""
        return ((self,), None) if self.free else ((), self)


class TreeDrafting:
    """A learned drafter that also drafts a tree when a schedule plans one (schedule.Take.TREE): the
    engine checks once that its learned drafter is one before it runs a schedule that may plan trees."""

    def propose_tree(self, context: torch.Tensor, shape: TreeShape) -> Draft:
        """A tree of at most ``shape.nodes`` nodes after ``context``."""
        raise NotImplementedError


class TreesOnly(Drafter):
    """A drafter whose every draft is a tree (Draft.parents): the engine's K is its node budget, not
    its depth, and no lossy rule (they judge chains) applies."""


class Composite(Drafter):
    """A drafter made of others. What the engine must know of it (what it needs of the target, whether
    it drafts trees) is derived from its parts, never copied: a wrapper cannot hide what it wraps,
    and a tree inside lookup is still refused a lossy rule."""

    def components(self) -> tuple[Drafter, ...]:
        raise NotImplementedError

    def fork(self) -> Drafter:
        raise NotImplementedError(f"{type(self).__name__} makes no drafter of forked parts (Drafter.fork)")

    @property
    def needs(self) -> Needs:
        return Needs.union(d.needs for d in self.components())


def drafts_trees(drafter: Drafter | None) -> bool:
    """Whether ``drafter``'s drafts are trees: it drafts nothing else, or a part of it does."""
    if isinstance(drafter, TreesOnly):
        return True
    return isinstance(drafter, Composite) and any(drafts_trees(d) for d in drafter.components())


def parts(drafter: Drafter | None) -> tuple[tuple[Drafter, ...], Drafter | None]:
    """A drafter as (free drafters, learned drafter), as it declares them (``Drafter.parts``)."""
    return ((), None) if drafter is None else drafter.parts()


def autoregress(logits: torch.Tensor, step, k: int, sampling: SamplingParams, noise: PositionNoise | None, *,
                start: int = 0, gate: DraftGate | None = None) -> Draft:
    """Draft up to ``k`` tokens from the first row of logits, calling ``step(token)`` for the next row.

    Greedy takes the argmax; sampling takes the race's winner under q = distribution(logits) and the
    noise of the position it drafts for (``start`` the first), which is a draw from q, and keeps q
    (the lossy rules read it). With a ``gate``, each guess is first weighed on the drafter's
    confidence, and drafting stops at the first not worth verifying. Shared by every drafter that
    has logits of its own.
    """
    tokens, probs, confidences = [], [], []
    for i in range(k):
        q = None if sampling.greedy else distribution(logits, sampling)
        if gate is not None:
            confidences.append(confidence(torch.softmax(logits.float(), -1) if sampling.greedy else q))
            if not gate.worth(confidences):
                break
        if sampling.greedy:
            token = logits.argmax()
        else:
            token = race_winner(q, noise.row(start + i))
            probs.append(q)
        tokens.append(token)
        if i + 1 < k:
            logits = step(token)
    if not tokens:
        return Draft(torch.empty(0, dtype=torch.long), confidence=confidences)
    return Draft(torch.stack(tokens).cpu(), torch.stack(probs) if probs else None,
                 confidence=confidences if gate is not None else None)


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading tokens ``a`` and ``b`` share: what a drafter's own cache may keep."""
    n = min(a.shape[0], b.shape[0])
    same = (a[:n] == b[:n]).to(torch.int64)
    return int(same.cumprod(0).sum())
