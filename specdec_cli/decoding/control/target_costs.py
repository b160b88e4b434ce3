"""What a round costs the target, as the adaptive controller (adaptive.py) estimates it: the verify
seconds of each block size, learnt from rounds that ran a forward of their own and kept as over an
empty cache, plus what the round's context adds (``context_cost``, per block size:
blocks.context_slopes); and a round's bookkeeping outside draft and verify. Before any round they are
in one-token forwards, from the prior's verify costs.
"""

from __future__ import annotations

from ..events import RoundEvent
from .estimates import per_cached_token, smooth
from .priors import Prior

UNKNOWN = object()  # a derived figure not yet computed since the last observe (None is a value)


class TargetCosts:
    """The target's side of a round's seconds, for one scenario's controller."""

    def __init__(self, prior: Prior, smoothing: float, context_cost: dict[int, float] | None = None):
        self.prior, self.smoothing = prior, smoothing
        self.block_s: dict[int, float] = {}  # block size → smoothed verify seconds, less what its context cost
        self.context_cost = dict(context_cost or {})  # K → seconds a cached token adds to its verify block
        self.cached = 0  # tokens cached when the next round verifies (``context``)
        self.other_s: float | None = None  # a round's bookkeeping outside draft and verify
        # Verify seconds by K and the one-token forward, derived from block_s (and the prior) and
        # read hundreds of times a round; only observe changes block_s, and it clears them.
        self._verify: dict[int, float] = {}
        self._one: float | None | object = UNKNOWN  # one_token_s, once derived this round

    def context(self, cached: int) -> None:
        """The next round verifies over ``cached`` tokens: every verify estimate is made for that."""
        if cached != self.cached:
            self.cached, self._verify = cached, {}

    def observe(self, event: RoundEvent) -> None:
        drafted = len(event.drafted)
        if event.batch == 1:  # a forward shared with other answers costs what their rows cost (batch_rows.py)
            # Less what the context cost; at least a quarter of what was seen, should a slope measured
            # on a busy minute overstate it, so that no block ever looks free.
            base = max(event.verify_s - self.context_s(drafted, event.cached), event.verify_s / 4)
            self.block_s[drafted + 1] = smooth(self.block_s.get(drafted + 1), base, self.smoothing)
        # Finding the free drafters' drafts is paid every round, whoever drafts: bookkeeping, not drafting.
        self.other_s = smooth(self.other_s, event.other_s + event.offer_s, self.smoothing)
        self._verify, self._one = {}, UNKNOWN

    def one_token_s(self) -> float | None:
        """Seconds of a 1-token forward: observed, or inferred from another block and the prior."""
        if self._one is UNKNOWN:
            if 1 in self.block_s:
                self._one = self.block_s[1]
            else:
                inferred = sorted(s / self.prior.cost(size - 1) for size, s in self.block_s.items())
                self._one = inferred[len(inferred) // 2] if inferred else None
        return self._one

    def verify_s(self, k: int) -> float:
        """Seconds of verifying K drafts over the next round's context."""
        seconds = self._verify.get(k)
        if seconds is None:
            one = self.one_token_s()
            if k + 1 in self.block_s:
                seconds = self.block_s[k + 1]
            else:
                seconds = (one or 1.0) * (self.prior.cost(k) if k else 1.0)
            if one is not None:  # in seconds (before any round, in one-token forwards, the prior's)
                seconds += self.context_s(k, self.cached)
            self._verify[k] = seconds
        return seconds

    def context_s(self, k: int, cached: int) -> float:
        """What ``cached`` tokens add to the verify seconds of K drafts."""
        return per_cached_token(self.context_cost, k) * cached if self.context_cost else 0.0

    def overhead_s(self) -> float:
        """A round's bookkeeping, once a forward was measured (before, costs are in forwards)."""
        return self.other_s if self.other_s is not None and self.one_token_s() is not None else 0.0
