"""A round's draft, in two steps: the schedule's decision (how many tokens, from where: the drafter
as it is, a free drafter's ready draft, the learned drafter's chain or tree, or none), then the draft
itself. Between the two a batched step may cap a chain by what its rows cost the whole batch
(control/batch_rows.py); a lone answer drafts as decided."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..limits import MAX_K
from .drafters.base import Draft, Drafter, TreeDrafting, parts
from .schedule import Plan, Take
from .tree import TreeShape

if TYPE_CHECKING:
    from .request import Request


@dataclass
class Decision:
    """What a round will draft, before drafting: the plan, its K (a chain's depth, a tree's nodes,
    bounded by the budget and the plan), the free drafters' offers, the seconds spent finding them
    (every round pays it, whoever drafts) and spent deciding in all."""

    plan: Plan
    want: int
    tree: bool
    offers: dict[str, Draft]
    learned: Drafter | None
    offer_s: float
    decide_s: float


def decide(request: Request, drafts_trees: bool) -> Decision:
    """The schedule's plan among the free drafters' offers (found every round, whoever drafts), the
    learned drafter and none."""
    started = time.perf_counter()
    room = max(0, min(MAX_K, request.left - 1))  # a round emits at most K + 1 tokens: past the budget is waste
    free, learned = parts(request.drafter)
    offers = ready_drafts(free, request.tokens, room) if request.schedule.reads_offer and room else {}
    offer_s = time.perf_counter() - started
    plan = request.schedule.plan({name: len(offer) for name, offer in offers.items()}, learned.name if learned else None, room)
    tree = plan.take is Take.TREE or (plan.take is Take.AS_IS and drafts_trees)
    # A chain's K is its depth; a tree's is its node count, however shallow (paths past the budget are cut).
    want = max(0, min(plan.k, MAX_K if room else 0) if tree else min(plan.k, room))
    if plan.take is Take.NOTHING:
        want = 0
    return Decision(plan, want, tree, offers, learned, offer_s, time.perf_counter() - started)


def gains(request: Request, decision: Decision) -> tuple[list[float], float] | None:
    """A chain's expected tokens by its drafts up to the decided K, and its drafter's seconds a token
    (``KSchedule.gains``); None where the plan is kept as it is (a tree, or a fixed K)."""
    if decision.tree:
        return None
    if decision.want == 0 or request.drafter is None:
        return [1.0], 0.0
    found = request.schedule.gains(decision.plan)
    return None if found is None else (list(found[0][: decision.want + 1]), found[1])


def propose(request: Request, decision: Decision, cap: int | None = None) -> tuple[int, Draft]:
    """The decided draft, a chain at most ``cap`` long (None: as decided), and its K."""
    plan, learned, drafter = decision.plan, decision.learned, request.drafter
    want = decision.want if cap is None or decision.tree else min(decision.want, cap)
    tokens, sampling, noise = request.tokens, request.sampling, request.noise
    if want == 0 or drafter is None:
        return want, Draft.empty()
    if plan.take is Take.OFFER:
        offer = decision.offers.get(plan.source)
        if offer is None or want > len(offer):
            raise ValueError(f"schedule took {want} tokens of {plan.source!r}'s offer; offered "
                             + (", ".join(f"{name!r} ({len(o)} tokens)" for name, o in decision.offers.items()) or "nothing"))
        return want, offer.first(want)
    if plan.take is Take.AS_IS:
        draft = drafter.propose(tokens, want, sampling, noise)
    elif learned is None:
        raise ValueError(f"schedule chose the learned drafter ({plan.take.value}); this drafter has none")
    elif plan.take is Take.LEARNED:
        gate = request.schedule.gate(plan.source, want)  # the drafter stops where its guesses stop paying (gate.py)
        draft = learned.propose(tokens, want, sampling, noise, gate=gate)
    elif not isinstance(learned, TreeDrafting):
        raise ValueError(f"schedule planned a tree; drafter {learned.name!r} drafts no trees")
    else:
        draft = learned.propose_tree(tokens, TreeShape(want))
    if draft.parents is None:
        return want, draft.first(want)
    if len(draft) > want:
        raise RuntimeError(f"drafter {drafter.name} proposed a tree of {len(draft)} nodes, {want} asked for")
    return want, draft


def ready_drafts(free: tuple[Drafter, ...], tokens: torch.Tensor, room: int) -> dict[str, Draft]:
    """Each free drafter's ready draft of at most ``room`` tokens, by its source (none where it has none)."""
    offers = {}
    for drafter in free:
        draft = drafter.propose(tokens, room, None, None)
        if len(draft):
            offers.setdefault(draft.source or drafter.name, draft)
    return offers
