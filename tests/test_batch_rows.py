"""K by batch size (decoding/control/batch_rows.py): a step's draft rows go where they raise the batch's
tokens per second, so a lone answer drafts as planned and a full compute-bound batch drafts nothing."""

import pytest

from specdec_cli.decoding.control.batch_rows import MIN_STEPS, StepCosts, attended, batch_lengths


def gains(*rates):
    """Expected tokens by drafts for per-position acceptance ``rates``: 1, 1 + a1, 1 + a1 + a1 a2, ..."""
    found, survive = [1.0], 1.0
    for rate in rates:
        survive *= rate
        found.append(found[-1] + survive)
    return found


def memory_bound(rows):  # a step's seconds and a row's: a row is cheap beside the weights every forward reads
    return 10.0 + rows, [1.0] * rows


def compute_bound(rows):
    return 2.0 + rows, [1.0] * rows


def test_a_lone_answer_drafts_what_pays_and_stops_where_a_row_no_longer_does():
    assert batch_lengths([gains(0.9, 0.9, 0.9, 0.9)], *memory_bound(1)) == [4]
    # at 11 s for one row, a draft row pays while its expected tokens exceed tokens / seconds so far
    assert batch_lengths([gains(0.9, 0.05, 0.9)], *memory_bound(1)) == [1]


def test_speculation_switches_off_as_the_batch_fills():
    likely = gains(0.7, 0.7, 0.7)
    # alone: 1/3 tok/s; a first draft row 1.7/4, a second 2.19/5, a third 2.53/6 would lower it
    assert batch_lengths([likely], *compute_bound(1)) == [2]
    assert batch_lengths([likely] * 2, *compute_bound(2)) == [1, 1]
    assert batch_lengths([likely] * 8, *compute_bound(8)) == [0] * 8  # 8/10 tok/s: a 0.7 row would lower it


def test_the_likelier_drafts_get_the_rows_and_kept_plans_count_their_rows():
    sure, unsure = gains(0.95, 0.95), gains(0.3, 0.3)
    assert batch_lengths([unsure, sure], 4.0, [1.0, 1.0]) == [0, 2]
    # a kept plan (None, e.g. a fixed K or a tree) is neither cut nor weighed, but its rows are paid
    assert batch_lengths([None, sure], 2.0 + 1 + 4 + 1, [1.0, 1.0]) == [None, 2]


def test_a_row_that_attends_a_long_context_costs_more_and_goes_to_the_shorter():
    likely = gains(0.8, 0.8)
    assert batch_lengths([likely, likely], 4.0, [0.5, 3.0]) == [2, 0]


def test_a_drafter_that_costs_a_forward_a_token_drafts_less_than_a_free_one():
    likely = gains(0.8, 0.8, 0.8)
    assert batch_lengths([likely, likely], *memory_bound(2), [0.0, 0.0]) == [3, 3]
    assert batch_lengths([likely, likely], *memory_bound(2), [0.0, 2.0]) == [3, 1]  # its drafts cost more than rows
    assert batch_lengths([likely, likely], *memory_bound(2), [0.0, 40.0]) == [3, 0]


def test_attended_counts_each_rows_own_position_and_those_before_it():
    assert attended(1, 0) == 1 and attended(1, 9) == 10 and attended(3, 5) == 6 + 7 + 8


def true_cost(blocks):
    """A step's seconds: 4 fixed, 2 an answer, 0.5 a further row, 1.5 a thousand positions attended."""
    rows = sum(r for r, _ in blocks)
    return 4 + 2 * len(blocks) + 0.5 * (rows - len(blocks)) + 1.5 * sum(attended(r, p) for r, p in blocks) / 1000


def test_step_costs_tell_answers_further_rows_and_context_apart():
    costs = StepCosts()
    full = [[(1 + (i + step) % 3, 100 + 10 * step) for i in range(16)] for step in range(MIN_STEPS)]
    for blocks in full[:-1]:
        costs.observe(blocks, true_cost(blocks))
    assert not costs.known()
    costs.observe(full[-1], true_cost(full[-1]))
    for n in (12, 6, 2):  # a job's end: fewer answers, longer contexts
        costs.observe([(1, 500 + n)] * n, true_cost([(1, 500 + n)] * n))
    assert costs.known()
    # two long answers left: priced as such, not as two rows of a full batch's
    assert costs.seconds([(1, 600)] * 2) == pytest.approx(true_cost([(1, 600)] * 2))
    assert costs.row_s(600) == pytest.approx(0.5 + 1.5 * 0.601)


def test_step_costs_are_unknown_until_two_counts_of_further_rows_are_seen():
    costs = StepCosts()
    for _ in range(2 * MIN_STEPS):
        costs.observe([(1, 50)] * 4, 0.02)
    assert not costs.known()  # what a further row costs cannot be told yet


def test_a_cost_fitted_below_nothing_is_held_at_nothing():
    costs = StepCosts()
    # noise: more answers seen faster; the answers' part is held at 0 and the rest fitted without it
    for answers, seconds in [(2, 0.03), (4, 0.02)] * MIN_STEPS:
        costs.observe([(2, 10)] * answers, seconds)
    assert (costs.coefficients() >= 0).all()
