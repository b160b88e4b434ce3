"""Rounds whose drafter the schedule picks (lookup's match, the learned drafter, or none): lossless,
and free while speculation is off (no draft forward; the head's features kept at the cost of the rows)."""

import random

import pytest
import torch
from exactness import PROMPT as SMALL_PROMPT
from exactness import VOCAB, assert_lossless, small_models

from specdec_cli.decoding.acceptance import SamplingParams
from specdec_cli.decoding.drafters.base import Verified
from specdec_cli.decoding.drafters.lookup import LookupFirst
from specdec_cli.decoding.drafters.model import ModelDrafter
from specdec_cli.decoding.engine import KSchedule, SpeculativeEngine
from specdec_cli.decoding.drafters.head import HeadDrafter
from specdec_cli.decoding.head_network import DraftHead, head_config
from specdec_cli.decoding.schedule import Plan, Take

PROMPT = [0, 5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6]


class Scripted(KSchedule):
    """A schedule that plans each round from a script: 'none', 'offer' or 'learned' (K 3)."""

    reads_offer = True

    def __init__(self, script):
        self.script, self.round, self.seen = list(script), 0, []

    def plan(self, offers, learned, room):
        offer_source, offer = next(iter(offers.items()), (None, 0))  # the first free drafter's
        what = self.script[self.round % len(self.script)]
        self.round += 1
        self.seen.append((offer, offer_source, learned))
        if what == "offer" and offer:
            return Plan(min(3, offer), Take.OFFER, offer_source)
        if what == "learned":
            return Plan(min(3, room), Take.LEARNED, learned)
        return Plan.nothing()

    def observe(self, event):
        pass


def random_head(target, seed=3):
    torch.manual_seed(seed)
    return HeadDrafter(DraftHead(head_config(target)), target)


def tokens_of(engine, schedule, n=30, **kwargs):
    return [t for e in engine.generate(PROMPT, k=schedule, max_new_tokens=n, **kwargs) for t in e.emitted]


def test_any_mix_of_lookup_learned_and_plain_rounds_is_token_identical_to_plain(target, similar):
    plain = tokens_of(SpeculativeEngine(target, None, {1}), 0)
    rng = random.Random(0)
    for learned in (ModelDrafter(similar, target.config.vocab_size), random_head(target)):
        script = [rng.choice(["none", "offer", "learned"]) for _ in range(40)]
        schedule = Scripted(script)
        engine = SpeculativeEngine(target, LookupFirst(learned), {1})
        events = list(engine.generate(PROMPT, k=schedule, max_new_tokens=30))
        assert [t for e in events for t in e.emitted] == plain
        sources = {e.source for e in events}
        assert {"", learned.name} <= sources and any(s.startswith("lookup") for s in sources)  # every kind of round ran
        assert all(len(e.drafted) <= offer for e, (offer, source, _) in zip(events, schedule.seen)
                   if e.source == source)  # a lookup round's K is capped by its match


def test_off_rounds_run_no_draft_forward_and_the_head_catches_up_exactly(target):
    head = random_head(target)
    calls = []
    real = head.propose
    head.propose = lambda *args, **kwargs: calls.append(args[0].shape[0]) or real(*args, **kwargs)
    schedule = Scripted(["none"] * 12 + ["learned"] + ["none"] * 40)
    engine = SpeculativeEngine(target, LookupFirst(head), {1})
    events = list(engine.generate(PROMPT, k=schedule, max_new_tokens=20))
    assert len(calls) == 1 and events[12].source == "head"  # one draft run in 20 rounds: the one asked for

    # The head that sat out 12 rounds drafts what a fresh head given every feature at once drafts.
    context = torch.tensor(PROMPT + [t for e in events[:12] for t in e.emitted])
    assert calls == [context.shape[0]]
    with torch.inference_mode():
        features = target(context[None, :-1], output_hidden_states=-1).hidden_states[-1][0]
        fresh = random_head(target)
        fresh.observe(Verified(context, len(PROMPT), features=features))
        expected = fresh.propose(context, 3, SamplingParams(), None).tokens.tolist()
    assert events[12].drafted == expected


def test_head_features_grow_by_doubling_not_by_copying_every_round(target):
    head = random_head(target)
    rows = torch.randn(1000, target.config.hidden_size)
    buffers = set()
    for i, row in enumerate(rows):
        head.observe(Verified(torch.arange(i + 2), 1, features=row[None]))
        buffers.add(head._rows.data_ptr())
    assert torch.equal(head.features, rows)
    assert len(buffers) <= 3  # 256 → 512 → 1024 rows: one copy per doubling, not one per round


@pytest.mark.slow
def test_choosing_between_lookup_and_the_learned_drafter_keeps_the_targets_exact_distribution():
    """Whichever drafter the schedule picks, sampling stays exactly the target's distribution."""
    target, disagreeing = small_models()
    rng = random.Random(1)

    class Coin(Scripted):
        def plan(self, offers, learned, room):
            offer_source, offer = next(iter(offers.items()), (None, 0))  # the first free drafter's
            self.seen.append((offer, offer_source, learned))
            if offer and rng.random() < 0.5:
                return Plan(min(2, offer), Take.OFFER, offer_source)
            return Plan(min(2, room), Take.LEARNED, learned)

    sampling, prompt = SamplingParams(1.0), SMALL_PROMPT + SMALL_PROMPT[:2]  # "3 4" recurs: lookup offers "5"
    schedule = Coin([])
    assert_lossless(target, LookupFirst(ModelDrafter(disagreeing, VOCAB)), sampling, k=schedule, prompt=prompt)
    assert any(offer for offer, _, _ in schedule.seen)
