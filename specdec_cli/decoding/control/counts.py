"""What each drafter did in a prompt under the adaptive controller: the statistics' per-drafter figures."""

from __future__ import annotations

from dataclasses import dataclass

from ..events import RoundEvent


@dataclass
class DrafterCounts:
    """One drafter's rounds in a prompt, for the statistics: what it drafted, what the target kept
    (``judged``: the drafts the target tested, the kept ones and the first refused), its drafting time."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    judged: int = 0
    draft_s: float = 0.0

    def add(self, event: RoundEvent) -> None:
        self.rounds += 1
        self.drafted += len(event.drafted)
        self.accepted += event.accepted
        self.judged += event.judged
        self.draft_s += event.draft_s

    def report(self) -> dict:
        return {"rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
                "alpha": round(self.accepted / self.judged, 4) if self.judged else None,
                "tokens_per_round": round((self.accepted + self.rounds) / self.rounds, 3) if self.rounds else None,
                "draft_s": round(self.draft_s, 4)}
