"""A verify block's cost by the context it attends over: measured at two contexts (blocks.py), kept
by the adaptive controller as seconds over an empty cache plus what each cached token adds, and
told the round's context by the engine."""

import logging

import pytest
from conftest import PROMPT

from specdec_cli.decoding import blocks
from specdec_cli.decoding.acceptance import SamplingParams
from specdec_cli.decoding.blocks import context_slopes, long_context
from specdec_cli.decoding.control.adaptive import AdaptiveK
from specdec_cli.decoding.control.estimates import per_cached_token
from specdec_cli.decoding.control.priors import Prior
from specdec_cli.decoding.drafters.lookup import LookupFirst
from specdec_cli.decoding.drafters.model import ModelDrafter
from specdec_cli.decoding.schedule import Plan
from specdec_cli.decoding.engine import FixedK, RoundEvent, SpeculativeEngine

ONE = 0.01  # seconds of a one-token forward over an empty cache, in these synthetic rounds
COSTS = {k: 1.0 + 0.1 * k for k in range(1, 9)}  # verify cost of K drafts, in one-token forwards
PER_TOKEN = {k: 1e-6 * (2 + 3 * k) for k in range(0, 9)}  # seconds a cached token adds, by K


def seconds(k: int, cached: int) -> float:
    return ONE * COSTS.get(k, 1.0) + PER_TOKEN[k] * cached


def event(k: int, accepted: int, cached: int) -> RoundEvent:
    drafted = list(range(10, 10 + k))
    return RoundEvent(k=k, drafted=drafted, accepted=accepted, token=99, emitted=drafted[:accepted] + [99],
                      draft_s=0.001 * k, verify_s=seconds(k, cached), finished=False, source="model" if k else "",
                      cached=cached)


def test_slopes_are_per_cached_token_by_k_at_the_planned_length_and_never_negative():
    short = {1: 0.010, 2: 0.011, 3: 0.013, 4: 0.012}
    long = {1: 0.020, 2: 0.023, 3: 0.026, 4: 0.0119}
    assert context_slopes(short, long, {}, (100, 1100)) == pytest.approx({0: 1e-5, 1: 1.2e-5, 2: 1.3e-5, 3: 0.0})
    # Padded as the engine runs them: a block of 3 is run at 4, and costs what 4 does over either context.
    assert context_slopes(short, long, {3: 4}, (100, 1100))[2] == 0.0


def test_past_the_largest_measured_k_a_slope_grows_by_its_last_step():
    measured = {0: 1.0, 1: 2.0, 2: 3.5}
    assert [per_cached_token(measured, k) for k in range(5)] == [1.0, 2.0, 3.5, 5.0, 6.5]
    assert per_cached_token({}, 3) == 0.0 and per_cached_token({0: 1.0}, 4) == 1.0


def test_the_long_measurement_fits_the_model_and_is_skipped_where_it_would_not_be_long(target, monkeypatch):
    assert target.config.max_position_embeddings == 256 and long_context(target) is None
    monkeypatch.setattr(target.config, "max_position_embeddings", 8192)
    assert long_context(target) == blocks.LONG_CONTEXT
    monkeypatch.setattr(target.config, "max_position_embeddings", 600)
    assert long_context(target) == 600 - blocks.MEASURED_LENGTHS


def test_the_slopes_come_from_two_measurements_of_one_sitting_kept_apart_from_the_plans(target, tmp_path,
                                                                                        monkeypatch, caplog):
    """The padding plan's costs may be from another day; the slopes' short and long ones are measured
    together and kept in files of their own, read from then on. Each measurement says so in one line;
    reading them says nothing."""
    caplog.set_level(logging.INFO, logger="specdec")
    monkeypatch.setattr(target.config, "max_position_embeddings", 8192)
    measured = {64: {1: 0.010, 2: 0.011}, 1024: {1: 0.0148, 2: 0.0206}}
    monkeypatch.setattr(blocks, "time_blocks", lambda model, context: {n: s * 2 for n, s in measured[context].items()})
    assert blocks.cached_costs(target, "tiny", tmp_path) == {1: 0.020, 2: 0.022}  # the plan's, on a slower day
    monkeypatch.setattr(blocks, "time_blocks", lambda model, context: measured[context])
    slopes = blocks.cached_context_slopes(target, "tiny", tmp_path, {})
    assert slopes == pytest.approx({0: 0.0048 / 960, 1: 0.0096 / 960})
    assert caplog.messages == [f"timing verify blocks of 1 to 10 tokens on this machine (once: kept in {tmp_path})",
                               f"timing verify blocks over 64 and 1024 cached tokens on this machine (once: kept in {tmp_path})"]
    monkeypatch.setattr(blocks, "time_blocks", lambda model, context: pytest.fail("measured again"))
    assert blocks.cached_context_slopes(target, "tiny", tmp_path, {}) == slopes
    assert blocks.cached_costs(target, "tiny", tmp_path) == {1: 0.020, 2: 0.022}
    assert len(list(tmp_path.glob("block-costs-*.json"))) == 3
    assert len(caplog.messages) == 2
    # Every other context is a file of its own, never the padding plan's.
    monkeypatch.setattr(blocks, "time_blocks", lambda model, context: {1: 0.5, 2: 0.6})
    assert blocks.cached_costs(target, "tiny", tmp_path, 1024) == {1: 0.5, 2: 0.6}


def test_rounds_over_a_long_context_teach_the_cost_of_a_short_one():
    """What long prompts' rounds measured is kept less their context's share: the estimate for a
    short context is the block's own cost, and for a long one that plus what its tokens add."""
    schedule = AdaptiveK(Prior(2, 0.5, 0.01, COSTS), context_cost=PER_TOKEN)
    for _ in range(30):
        for k in (0, 1, 2, 3):
            schedule.observe(event(k, 1 if k else 0, cached=1500))
    for cached in (0, 40, 3000):
        schedule.context(cached)
        assert [schedule.costs.verify_s(k) for k in range(4)] == pytest.approx([seconds(k, cached) for k in range(4)])


def test_drafting_that_pays_over_a_short_context_is_declined_over_a_long_one():
    """The same drafter, the same acceptance: over 50 cached tokens two drafts pay; over 4,000 the
    block's attention makes every K slower than plain decoding, so the round drafts nothing."""
    steep = {0: 1e-6, **{k: 1e-6 + 4e-6 * k for k in range(1, 9)}}
    schedule = AdaptiveK(Prior(2, 0.6, 0.01, COSTS), context_cost=steep)
    for _ in range(40):
        for k in (0, 1, 2, 3):
            schedule.observe(event(k, min(k, 2), cached=50))
    schedule.context(50)
    assert schedule.plan({}, "model", 8).k >= 2
    schedule.context(4000)
    assert schedule.plan({}, "model", 8) == Plan.nothing()
    schedule.context(50)
    assert schedule.plan({}, "model", 8).k >= 2


def test_the_engine_tells_the_schedule_each_rounds_context_and_the_event_records_it(target, similar):
    class Told(FixedK):
        def __init__(self):
            super().__init__(3)
            self.told = []

        def context(self, cached):
            self.told.append(cached)

    schedule = Told()
    drafter = LookupFirst(ModelDrafter(similar, target.config.vocab_size))
    events = list(SpeculativeEngine(target, drafter, {1}).generate(
        PROMPT, k=schedule, max_new_tokens=12, sampling=SamplingParams()))
    expected, cached = [], len(PROMPT) - 1
    for round_ in events:
        expected.append(cached)
        cached += len(round_.emitted)
    assert schedule.told == expected == [round_.cached for round_ in events] and len(events) > 1
