"""Prompt lookup (``ngram``): draft what followed the context's last words where they occurred
before; and lookup first (``LookupFirst``): prompt lookup where the text repeats itself, a learned
drafter everywhere else."""

from __future__ import annotations

import torch

from .base import Composite, Draft, Drafter, Verified


class NgramDrafter(Drafter):
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens and
    propose what followed it. Free to run, and strong wherever output copies input (code edits,
    summaries, quoting).

    The n-grams are indexed as the context grows (latest start per n-gram), so a round's lookup
    costs the tokens it added, not the context: scanning the whole context for each n every round
    is paid by adaptive speculation even while it drafts nothing (docs/notebook.md, "Figures that
    were in the code's docstrings")."""

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
    (on the target's answers a first guess is kept far more often after a long match than after a
    one-token one: priors.FREE_RATES), so the adaptive controller keeps separate estimates for each."""
    return "lookup" if n >= 3 else f"lookup-{n}"


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

    def fork(self) -> LookupFirst:
        return LookupFirst(self.learned.fork(), self.lookup.fork())

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
