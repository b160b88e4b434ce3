"""Drafters: whatever proposes the next K tokens for the target to judge.

One small interface (``propose``, ``observe`` and ``reset``), modelled on transformers'
CandidateGenerator. A drafter may return fewer tokens than asked for (n-gram lookup finds no match,
say); the engine then verifies what it got. Which tokens survive is never the drafter's business;
what the target said of them, every drafter sees (``observe``), and the ones that learn learn from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .acceptance import SamplingParams, distribution
from .control.gate import DraftGate, confidence
from .coupling import PositionNoise, race_winner
from .kv import crop_cache, input_device, reserved_cache
from .tree import TreeShape

if TYPE_CHECKING:
    from transformers import PreTrainedModel


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
    source: str = ""  # which drafter proposed it (lookup_source(n), "head", "model"): the controller's key
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
    and ``successors`` the target's top ids after each of them, best first (rows × ``successors_k``;
    None when no drafter asked). ``features``: the target's features of the positions that became
    confirmed (for a drafter that ``uses_target_features``). ``finished``: the answer is complete;
    ``prompt_length`` says where it began.
    """

    context: torch.Tensor
    prompt_length: int
    block: torch.Tensor | None = None
    successors: torch.Tensor | None = None
    features: torch.Tensor | None = None
    finished: bool = False


def top_ids(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` highest-scoring ids of each row, best first. One id by numpy's argmax: 0.02 ms for
    four rows of a 49k vocabulary where torch's argmax and topk take 0.16-0.27 ms, 1.4-2.3 % of a
    one-token forward added to every round (benchmarks/free_drafter_bookkeeping.py)."""
    if k == 1:
        return torch.from_numpy(logits.numpy().argmax(-1)[:, None])
    return torch.topk(logits, k).indices


class Drafter:
    """What every drafter is: ``name``, ``reset`` and ``propose``; the optional parts are declared
    here with their defaults, and a drafter that has them overrides them (no attribute is probed for).

    ``free``: its draft costs nothing to find (a lookup in a table), so a schedule that weighs
    drafters is shown it every round before it decides; a drafter that is not free (a model, a
    head) costs a forward per token and drafts only when chosen. ``successors_k``: how many of the
    target's top ids per verified row its ``observe`` wants (0: none; the engine computes them once
    for every drafter that asks).

    ``uses_target_features`` (a draft head): the engine hands ``add_features(rows)`` the target's
    hidden states named in ``feature_layers`` (by default the last one, post-norm) of every position
    that became confirmed, in cache order. ``drafts_trees``: ``propose`` returns trees
    (Draft.parents), and K is its node budget, not its depth. ``propose_tree``: a learned drafter
    that also drafts a tree when a schedule plans one (schedule.Take.TREE).
    """

    name: str
    free: bool = False
    successors_k: int = 0
    uses_target_features: bool = False
    feature_layers: tuple[int, ...] = (-1,)
    drafts_trees: bool = False

    def reset(self) -> None:
        """Forget the previous prompt (what a drafter learns across prompts, it keeps)."""

    def observe(self, verified: Verified) -> None:
        """See what the target confirmed and predicted; a draft head takes its features here."""
        if self.uses_target_features and verified.features is not None:
            self.add_features(verified.features)

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

    def add_features(self, rows: torch.Tensor) -> None:
        """The target's features of newly confirmed positions (only called when ``uses_target_features``)."""

    def parts(self) -> tuple[tuple["Drafter", ...], "Drafter | None"]:
        """(free drafters, learned drafter): what a schedule that weighs drafters chooses among. A free
        drafter's draft is shown to it every round; a model or head is asked only when chosen. By
        default a drafter is one or the other, whole."""
        return ((self,), None) if self.free else ((), self)

    def propose_tree(self, context: torch.Tensor, shape: TreeShape) -> Draft:
        """A tree of at most ``shape.nodes`` nodes after ``context``."""
        raise ValueError(f"drafter {self.name!r} drafts no trees")


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens and
    propose what followed it. Free to run, and strong wherever output copies input (code edits,
    summaries, quoting).

    The n-grams are indexed as the context grows (latest start per n-gram), so a round's lookup
    costs the tokens it added, not the context: scanning the whole context for each n every round
    took ~0.16 ms, ~1 % of an int4 token, paid by adaptive speculation even while it drafts nothing."""

    name = "ngram"
    free = True

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("n-gram drafter needs 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.reset()

    @classmethod
    def for_pair(cls, spec, vocab_size: int) -> NgramDrafter:
        return cls(spec.max_ngram, spec.min_ngram)

    def reset(self) -> None:
        self._context = torch.empty(0, dtype=torch.long)  # what the index covers
        self._tokens: list[int] = []
        self._latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(self.min_ngram, self.max_ngram + 1)}

    def propose(self, context, k, sampling, noise, gate=None) -> Draft:
        tokens = self._index(context)
        length = len(tokens)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            start = self._latest[n].get(tuple(tokens[length - n :]))
            if start is not None:
                return Draft(context[start + n : start + n + k].clone(), source=lookup_source(n))
        return Draft.empty()

    def _index(self, context: torch.Tensor) -> list[int]:
        """The index brought up to ``context``: every window with a successor in it (one ending at
        length − 2 or before), by n-gram, the latest start kept. A context that does not extend the
        indexed one (another prompt) is indexed afresh."""
        seen = self._context.shape[0]
        if context.shape[0] < seen or not torch.equal(context[:seen], self._context):
            self.reset()
            seen = 0
        tokens = self._tokens
        tokens += context[seen:].tolist()
        self._context = context.clone()
        for end in range(max(seen - 1, 0), len(tokens) - 1):
            for n, latest in self._latest.items():
                if end + 1 >= n:
                    latest[tuple(tokens[end + 1 - n : end + 1])] = end + 1 - n
        return tokens


def lookup_source(n: int) -> str:
    """A lookup draft's source, by the length of its match: the longer, the stronger the evidence
    (the target's answers: first guesses kept ~20 % of the time on a one-token match, ~50 % on
    two, ~80 % on three or more), so the adaptive controller keeps separate estimates for each."""
    return "lookup" if n >= 3 else f"lookup-{n}"


class Composite(Drafter):
    """A drafter made of others. What the engine must know of it (it needs the target's features, it
    drafts trees, how many successors it reads) is derived from its parts, never copied: a wrapper
    cannot hide what it wraps, and a tree inside lookup is still refused a lossy rule."""

    def components(self) -> tuple[Drafter, ...]:
        raise NotImplementedError

    @property
    def uses_target_features(self) -> bool:
        return any(d.uses_target_features for d in self.components())

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return next((d.feature_layers for d in self.components() if d.uses_target_features), (-1,))

    @property
    def drafts_trees(self) -> bool:
        return any(d.drafts_trees for d in self.components())

    @property
    def successors_k(self) -> int:
        return max(d.successors_k for d in self.components())


class LookupFirst(Composite):
    """Prompt lookup where the text repeats itself, a learned drafter everywhere else.

    A lookup hit costs nothing to draft and runs long (code edits, quoting); the learned drafter
    covers the rounds where lookup has nothing to offer. Lookup here needs an n-gram of at least
    two tokens: a single-token match is weaker evidence than a trained drafter's guess. Each round's
    draft comes whole from one of the two, with that one's q, so the acceptance test is unchanged.
    """

    def __init__(self, learned: Drafter, lookup: NgramDrafter | None = None):
        self.learned, self.lookup = learned, lookup or NgramDrafter(max_ngram=3, min_ngram=2)
        # What the adaptive controller is offered before it decides: any match, one-token ones too,
        # tagged by their length; it weighs them against the learned drafter on its own estimates.
        self.any_match = NgramDrafter(max_ngram=self.lookup.max_ngram, min_ngram=1)
        self.name = f"ngram+{learned.name}"

    def components(self) -> tuple[Drafter, ...]:
        return self.lookup, self.any_match, self.learned

    def reset(self) -> None:
        self.lookup.reset()
        self.any_match.reset()
        self.learned.reset()

    def observe(self, verified: Verified) -> None:
        self.learned.observe(verified)  # every round, used or not: a head must see every position

    def propose(self, context, k, sampling, noise, gate=None) -> Draft:
        draft = self.lookup.propose(context, k, sampling, noise)
        return draft if len(draft) else self.learned.propose(context, k, sampling, noise)

    def parts(self) -> tuple[tuple[Drafter, ...], Drafter]:
        """Any lookup match (free to find), for a schedule that weighs it against the learned drafter."""
        return (self.any_match,), self.learned


class Beside(Composite):
    """A drafter with free drafters beside it that only a schedule weighing drafters each round
    (``-k auto``) asks: a fixed K drafts with ``main`` alone, as before. Every one of them observes
    every round, drafting or not: the ones that learn from the target learn all the time."""

    def __init__(self, main: Drafter, beside: tuple[Drafter, ...]):
        if not all(d.free for d in beside):
            raise ValueError("only free drafters are offered beside another")
        self.main, self.beside = main, tuple(beside)
        self.name = main.name

    def components(self) -> tuple[Drafter, ...]:
        return self.main, *self.beside

    def reset(self) -> None:
        for drafter in self.components():
            drafter.reset()

    def observe(self, verified: Verified) -> None:
        for drafter in self.components():
            drafter.observe(verified)

    def propose(self, context, k, sampling, noise, gate=None) -> Draft:
        return self.main.propose(context, k, sampling, noise, gate)

    def propose_tree(self, context: torch.Tensor, shape: TreeShape) -> Draft:
        return self.main.propose_tree(context, shape)

    def parts(self) -> tuple[tuple[Drafter, ...], Drafter | None]:
        free, learned = self.main.parts()
        return (*free, *self.beside), learned


def parts(drafter: Drafter | None) -> tuple[tuple[Drafter, ...], Drafter | None]:
    """A drafter as (free drafters, learned drafter), as it declares them (``Drafter.parts``)."""
    return ((), None) if drafter is None else drafter.parts()


class ModelDrafter(Drafter):
    """A small causal LM drafting autoregressively with its own KV cache.

    The cache is kept across rounds and cropped to the longest prefix it shares with the new
    context, so accepted tokens are never recomputed.
    """

    name = "model"

    def __init__(self, model: PreTrainedModel, vocab_size: int, allowed: torch.Tensor | None = None):
        self.model = model
        # The target's vocabulary size: draft logits are cut or padded to it so that p and q
        # range over the same ids (checkpoints often pad their embedding matrices differently).
        self.vocab_size = vocab_size
        self.outside = None if allowed is None else ~vocab_mask(allowed, vocab_size)
        self.reset()

    def reset(self) -> None:
        self.cache = reserved_cache(self.model.config)
        self.cached_tokens = torch.empty(0, dtype=torch.long)

    @torch.inference_mode()
    def propose(self, context, k, sampling, noise, gate: DraftGate | None = None) -> Draft:
        if k <= 0:
            return Draft.empty()
        keep = min(common_prefix(self.cached_tokens, context), context.shape[0] - 1)
        crop_cache(self.cache, keep)
        draft = autoregress(self._forward(context[keep:]), lambda token: self._forward(token.view(1)), k, sampling,
                            noise, start=context.shape[0], gate=gate)
        draft.source = self.name
        self.cached_tokens = torch.cat([context, draft.tokens[:-1]])
        return draft

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        device = input_device(self.model)
        out = self.model(ids.view(1, -1).to(device), cache=self.cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[0, -1].float()
        if logits.shape[0] >= self.vocab_size:
            logits = logits[: self.vocab_size]
        else:
            logits = torch.cat([logits, logits.new_full((self.vocab_size - logits.shape[0],), float("-inf"))])
        return logits if self.outside is None else logits.masked_fill(self.outside.to(logits.device), float("-inf"))


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


def vocab_mask(allowed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Boolean mask of the ids a restricted output layer (--top-vocab) can propose.

    Outside it the draft's logits are -inf, so q is zero there; sampling stays lossless because the
    residual norm(max(0, p - q)) then equals p outside the set: the target alone decides there.
    """
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[allowed[allowed < vocab_size].long()] = True
    return mask


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    n = min(a.shape[0], b.shape[0])
    same = (a[:n] == b[:n]).to(torch.int64)
    return int(same.cumprod(0).sum())
