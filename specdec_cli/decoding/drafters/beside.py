"""Free drafters beside another: the ones a schedule weighing drafters each round (``-k auto``) is
offered beside the pair's own drafter (models.yaml's ``free:``)."""

from __future__ import annotations

from .base import Composite, Draft, Drafter, Verified


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

    def fork(self) -> Beside:
        return Beside(self.main.fork(), tuple(d.fork() for d in self.beside))

    def reset(self) -> None:
        for drafter in self.components():
            drafter.reset()

    def observe(self, verified: Verified) -> None:
        for drafter in self.components():
            drafter.observe(verified)

    def propose(self, context, k, sampling, noise, gate=None) -> Draft:
        return self.main.propose(context, k, sampling, noise, gate)

    def parts(self) -> tuple[tuple[Drafter, ...], Drafter | None]:
        free, learned = self.main.parts()
        return (*free, *self.beside), learned
