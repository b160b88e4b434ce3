"""Verify-block padding: cheaper block lengths chosen from measured costs, and output unchanged."""

import pytest
from conftest import decode

from specdec_cli.decoding.blocks import block_plan, time_blocks
from specdec_cli.decoding.drafters.lookup import NgramDrafter
from specdec_cli.decoding.drafters.model import ModelDrafter
from specdec_cli.decoding.engine import SpeculativeEngine

pytestmark = pytest.mark.cpu_kernels  # run again on AVX2's kernels (test_cpu_paths.py)

PAD_TO_8 = {n: 8 for n in range(2, 9)}  # every multi-token block run as 8 tokens


def test_plan_pads_to_the_cheapest_longer_block():
    costs = {1: 1.0, 2: 1.61, 3: 1.96, 4: 1.39, 5: 1.28, 6: 1.33, 7: 1.67, 8: 1.40}  # measured here
    assert block_plan(costs) == {1: 1, 2: 5, 3: 5, 4: 5, 5: 5, 6: 6, 7: 8, 8: 8}


def test_plan_ignores_savings_within_timing_noise():
    assert block_plan({1: 1.0, 2: 1.5, 3: 1.46}) == {1: 1, 2: 2, 3: 3}  # 3% cheaper: not worth padding


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_padded_blocks_give_the_same_tokens_and_rounds(target, similar, k):
    plain, _ = decode(target, None, 0, block_plan={})
    for drafter in (ModelDrafter(similar, target.config.vocab_size), NgramDrafter()):
        unpadded, events = decode(target, drafter, k, block_plan={})
        padded, padded_events = decode(target, drafter, k, block_plan=PAD_TO_8)
        assert padded == unpadded == plain
        assert [e.accepted for e in padded_events] == [e.accepted for e in events]


def test_padding_never_runs_past_the_context(target, similar):
    prompt = [5, 6, 7] * 83  # 249 of the 256 positions
    engine = SpeculativeEngine(target, ModelDrafter(similar, target.config.vocab_size), set(), {n: 32 for n in range(1, 33)})
    emitted = [t for e in engine.generate(prompt, k=3, max_new_tokens=20) for t in e.emitted]
    plain = [t for e in SpeculativeEngine(target, None, set()).generate(prompt, k=0, max_new_tokens=20) for t in e.emitted]
    assert emitted == plain and len(plain) == 7


def test_measure_times_every_block_length_over_the_same_context_and_keeps_the_fastest(target, monkeypatch):
    """Each length runs reps + 1 times (the first warms up, uncounted) on a cache cropped back to the
    context every time; the cost is the fastest counted run."""
    from specdec_cli.decoding import blocks

    passes = {1: [9, 7, 8], 2: [1, 8, 9], 3: [9, 9, 5], 4: [9, 6, 6]}  # seconds per pass; 2's fast warm-up is not counted
    durations = iter(passes[n][rep] for rep in range(3) for n in (1, 2, 3, 4))
    seen, now = [], [0.0]
    forward = type(target).forward

    def timed(self, input_ids=None, cache=None, **kwargs):
        seen.append((input_ids.shape[1], cache.get_seq_length()))
        if len(seen) > 1:  # a block, not the context's own forward
            now[0] += next(durations)
        return forward(self, input_ids, cache=cache, **kwargs)
    monkeypatch.setattr(type(target), "forward", timed)
    monkeypatch.setattr(blocks.time, "perf_counter", lambda: now[0])
    assert time_blocks(target, lengths=4, reps=2, context=8) == {1: 7, 2: 8, 3: 5, 4: 6}
    assert seen == [(8, 0)] + [(n, 8) for _ in range(3) for n in (1, 2, 3, 4)]


def test_a_measurement_a_busy_machine_skewed_is_not_kept(target, tmp_path, monkeypatch):
    """A block measured clearly cheaper than one token is noise from other work: such costs would
    pad every one-token forward (plain decoding included); they are measured again, and never saved."""
    from specdec_cli.decoding import blocks

    skewed, sane = {1: 0.035, 2: 0.031, 3: 0.035}, {1: 0.018, 2: 0.020, 3: 0.023}
    assert blocks.disturbed(skewed) and not blocks.disturbed(sane) and block_plan(skewed)[1] == 2
    results = iter([skewed, skewed, sane])
    monkeypatch.setattr(blocks, "time_blocks", lambda model, context: next(results))
    assert blocks.cached_costs(target, "tiny", tmp_path) == sane
    saved = list(tmp_path.glob("block-costs-*.json"))
    assert len(saved) == 1
    saved[0].write_text('{"1": 0.035, "2": 0.031}')  # a skewed file from before: measured again
    monkeypatch.setattr(blocks, "time_blocks", lambda model, context: skewed)
    assert blocks.cached_costs(target, "tiny", tmp_path) == {}
    assert saved[0].read_text() == '{"1": 0.035, "2": 0.031}'  # not overwritten by another skewed one


def test_ratios_within_each_pass_hold_where_the_machine_drifts():
    """A pass run at half speed moves its lengths alike: the median of each pass's ratios keeps the
    shape (1, 1.2, 1.5), where each length's fastest, taken from different passes, would not."""
    from specdec_cli.decoding.blocks import pass_ratios

    steady = {1: 10.0, 2: 12.0, 3: 15.0}
    slow = {n: 2 * s for n, s in steady.items()}
    odd = {1: 9.0, 2: 30.0, 3: 13.0}  # one pass that met a busy moment mid-way
    passes = [slow, steady, {1: 20.0, 2: 24.0, 3: 30.0}, odd, steady]
    assert pass_ratios(passes) == {1: 1.0, 2: pytest.approx(1.2), 3: pytest.approx(1.5)}
    fastest = {n: min(p[n] for p in passes) for n in steady}
    assert fastest[3] / fastest[1] != pytest.approx(1.5)
