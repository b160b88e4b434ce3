"""Per-prompt statistics, folded from round events.

Acceptance length alone lies, so these figures always travel together: acceptance rate, tokens
per verify round, rounds, completion length and wall time.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from ..decoding.events import RoundCounts, RoundEvent
from ..decoding.rules import parse_rule


# Kept for timing, or for bench and calibration, and not part of a run's reported statistics.
UNREPORTED = ("started", "first", "ended", "k_total", "judged", "other_s", "tree_rounds")


@dataclass
class RunStats(RoundCounts):
    k: int | str
    accept: str = "exact"  # the acceptance rule; one that is not lossless (rules.py) says so in every output
    tree: int | str | None = None  # a tree's node budget (`generate --tree N`), or auto (`--tree auto`); None for chains
    started: float = field(default_factory=time.perf_counter, repr=False)
    first: float | None = field(default=None, repr=False)  # when the first round (the prompt's forward before it) ended
    ended: float | None = field(default=None, repr=False)
    stop: str | None = None  # why the run ended (events.py: eos, max_new_tokens, context); None: not ended

    def add(self, event: RoundEvent) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        super().add(event)
        self.stop = event.stop or self.stop

    def finish(self) -> "RunStats":
        self.ended = time.perf_counter()
        return self

    @property
    def wall_s(self) -> float:
        return (self.ended or time.perf_counter()) - self.started

    @property
    def ttft_s(self) -> float | None:
        """Seconds to the first token: the prompt's forward and the first round, what a reader waits."""
        return None if self.first is None else self.first - self.started

    @property
    def acceptance_rate(self) -> float:
        """Share of drafted tokens the target kept; 0 when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verify round (1.0 for plain decoding)."""
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def lossless(self) -> bool:
        """Asked of the rule itself: ``standard`` is lossless too, though it is not the default."""
        return parse_rule(self.accept).lossless

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict:
        figures = {k: v for k, v in asdict(self).items() if k not in UNREPORTED}
        figures.update(
            lossless=self.lossless,
            acceptance_rate=round(self.acceptance_rate, 4),
            mean_accepted_length=round(self.mean_accepted_length, 4),
            wall_s=round(self.wall_s, 4),
            ttft_s=None if self.ttft_s is None else round(self.ttft_s, 4),
            tokens_per_s=round(self.tokens_per_s, 2),
            draft_s=round(self.draft_s, 4),
            verify_s=round(self.verify_s, 4),
        )
        if self.tree is not None:  # nodes verified per round: what a tree round costs the target
            figures["mean_nodes_verified"] = round(self.drafted / self.rounds, 4) if self.rounds else 0.0
        else:
            figures.pop("tree")
        order = ["k", *(["tree", "mean_nodes_verified"] if self.tree is not None else []), "drafted", "accepted", "acceptance_rate", "mean_accepted_length", "rounds",
                 "new_tokens", "stop", "wall_s", "ttft_s", "tokens_per_s", "draft_s", "verify_s", "fallback_forwards", "lossless", "accept"]
        return {key: figures[key] for key in order}
