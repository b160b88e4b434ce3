"""A suffix memory: draft what followed the same words in this process's earlier answers.

Prompt lookup (lookup.NgramDrafter) copies from the prompt and answer at hand; a batch job's
answers repeat across prompts instead (the same keys, phrases and layout, record after record).
This drafter remembers every finished answer: for each n-gram of MIN_MATCH to MAX_MATCH tokens,
how often each token of the answer followed it. The n-grams reach back into the last MAX_MATCH
tokens before the answer (a chat template's header, the prompt's last words), so that an answer's
first tokens can be drafted too: in a batch job they are the ones that repeat most. A draft matches the longest n-gram at the end of the context,
takes its most frequent successor, and goes on from the text so extended while the estimated
chance of the whole draft (the product of each step's count share) stays at least
MIN_PROBABILITY, and no further than the match was long (SPEC_FACTOR times it): a long match is
strong evidence, a short one weak (SuffixDecoding, Oliaro et al., NeurIPS 2025; vLLM's
``suffix_decoding_max_spec_factor`` and ``min_token_prob``). A draft is tagged by its match's
length (``suffix_source``): the longer the match, the more often the target keeps the draft
(priors.FREE_RATES), so the adaptive controller keeps apart estimates for each.

Bounded: the oldest answers are forgotten past MEMORY_TOKENS answer tokens, their counts removed.
It holds the text of earlier answers, in this process only, unless `generate --memory PATH` keeps
it in a file between runs (suffix_file.py).
"""

from __future__ import annotations

from collections import deque

import torch

from ...limits import MEMORY_TOKENS  # answer tokens remembered: ~42 MiB at most (limits.py says why there)
from .base import Draft, Drafter, Verified

MIN_MATCH, MAX_MATCH = 2, 8
MIN_PROBABILITY = 0.1
SPEC_FACTOR = 1.0


class SuffixDrafter(Drafter):
    """Free to ask, like prompt lookup; it remembers an answer once the engine says it is finished."""

    name = "suffix"
    free = True

    def __init__(self, memory_tokens: int = MEMORY_TOKENS, vocab_limit: int | None = None):
        self.memory_tokens, self.vocab_limit = memory_tokens, vocab_limit  # the target's vocabulary, where known
        self.counts: dict[tuple[int, ...], dict[int, int]] = {}
        self.answers: deque[tuple[list[int], int]] = deque()  # (tokens, how many lead into the answer)
        self.size = 0  # tokens in ``answers``, leads included
        self.remembered = 0  # answers ever remembered, forgotten ones included (suffix_file.py saves the new ones)

    @classmethod
    def for_pair(cls, spec, vocab_size: int) -> SuffixDrafter:
        return cls(vocab_limit=vocab_size)

    def observe(self, verified: Verified) -> None:
        if verified.finished:
            start = max(verified.prompt_length - MAX_MATCH, 0)
            self.remember(verified.context[start:].tolist(), verified.prompt_length - start)

    def remember(self, tokens: list[int], lead: int = 0) -> None:
        """Index an answer (``tokens`` after the first ``lead``, which only lead into it), then forget
        the oldest ones past the bound."""
        if len(tokens) <= lead:
            return
        self.answers.append((tokens, lead))
        self.remembered += 1
        self.size += len(tokens)
        count(self.counts, tokens, lead, 1)
        while self.size > self.memory_tokens and len(self.answers) > 1:
            old, old_lead = self.answers.popleft()
            self.size -= len(old)
            count(self.counts, old, old_lead, -1)

    def fork(self) -> SuffixDrafter:
        """Shared whole: every answer decoded beside another adds to what it learns, and reads it."""
        return self

    def propose(self, context, k, sampling, noise, gate=None) -> Draft:
        found, matched = continuation(self.counts, context[-MAX_MATCH:].tolist(), k)
        return Draft(torch.tensor(found, dtype=torch.long), source=suffix_source(matched) if found else "")


def suffix_source(match: int) -> str:
    """A remembered draft's source, by the length of the n-gram it continues."""
    return "suffix" if match >= 4 else f"suffix-{match}"


def count(counts: dict[tuple[int, ...], dict[int, int]], tokens: list[int], lead: int, step: int) -> None:
    """Add (step 1) or remove (step −1) every n-gram → next-token pair of ``tokens`` whose next token
    comes after the first ``lead``."""
    for end in range(max(lead, 1), len(tokens)):
        following = tokens[end]
        for n in range(MIN_MATCH, min(MAX_MATCH, end) + 1):
            key = tuple(tokens[end - n : end])
            seen = counts.setdefault(key, {})
            seen[following] = seen.get(following, 0) + step
            if seen[following] <= 0:
                del seen[following]
                if not seen:
                    del counts[key]


def longest_match(counts: dict[tuple[int, ...], dict[int, int]], tail: list[int]) -> int:
    """The length of the longest n-gram ending ``tail`` that the memory knows, 0 for none."""
    for n in range(min(MAX_MATCH, len(tail)), MIN_MATCH - 1, -1):
        if tuple(tail[-n:]) in counts:
            return n
    return 0


def continuation(counts: dict[tuple[int, ...], dict[int, int]], tail: list[int], k: int) -> tuple[list[int], int]:
    """Up to ``k`` tokens after ``tail``: the most frequent successor of its longest remembered
    n-gram, step by step, while the draft's estimated chance holds and the match is long enough;
    and that first match's length."""
    matched = longest_match(counts, tail)
    limit = min(k, int(SPEC_FACTOR * matched))
    found, chance, tail = [], 1.0, list(tail)
    while len(found) < limit:
        n = longest_match(counts, tail)
        if not n:
            break
        seen = counts[tuple(tail[-n:])]
        token, hits = max(seen.items(), key=lambda item: item[1])
        chance *= hits / sum(seen.values())
        if chance < MIN_PROBABILITY:
            break
        found.append(token)
        tail.append(token)
    return found, matched
