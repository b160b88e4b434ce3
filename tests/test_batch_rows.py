"""K by batch size (decoding/control/batch_rows.py): a step's draft rows go where they raise the batch's
tokens per second, so a lone answer drafts as planned and a full compute-bound batch drafts nothing."""

import pytest

from specdec_cli.decoding.control.batch_rows import RowCosts, batch_lengths


def gains(*rates):
    """Expected tokens by drafts for per-position acceptance ``rates``: 1, 1 + a1, 1 + a1 + a1 a2, ..."""
    found, survive = [1.0], 1.0
    for rate in rates:
        survive *= rate
        found.append(found[-1] + survive)
    return found


def memory_bound(rows):  # a row is cheap beside the weights every forward reads
    return 10.0 + rows


def test_a_lone_answer_drafts_what_pays_and_stops_where_a_row_no_longer_does():
    assert batch_lengths([gains(0.9, 0.9, 0.9, 0.9)], 1, memory_bound) == [4]
    # at 11 s for one row, a draft row pays while its expected tokens exceed tokens / seconds so far
    assert batch_lengths([gains(0.9, 0.05, 0.9)], 1, memory_bound) == [1]


def test_speculation_switches_off_as_the_batch_fills():
    def compute_bound(rows):
        return 2.0 + rows

    likely = gains(0.7, 0.7, 0.7)
    # alone: 1/3 tok/s; a first draft row 1.7/4, a second 2.19/5, a third 2.53/6 would lower it
    assert batch_lengths([likely], 1, compute_bound) == [2]
    assert batch_lengths([likely] * 2, 2, compute_bound) == [1, 1]
    assert batch_lengths([likely] * 8, 8, compute_bound) == [0] * 8  # 8/10 tok/s: a 0.7 row would lower it


def test_the_likelier_drafts_get_the_rows_and_kept_plans_count_their_rows():
    sure, unsure = gains(0.95, 0.95), gains(0.3, 0.3)
    assert batch_lengths([unsure, sure], 2, lambda rows: 2.0 + rows) == [0, 2]
    # a kept plan (None, e.g. a fixed K or a tree) is neither cut nor weighed, but its rows are paid
    assert batch_lengths([None, sure], 1 + 4 + 1, lambda rows: 2.0 + rows) == [None, 2]


def test_row_costs_are_learned_interpolated_and_extrapolated_never_falling():
    costs = RowCosts(smoothing=1.0)
    assert not costs.known()
    costs.observe(4, 0.020)
    costs.observe(12, 0.036)
    assert costs.known()
    assert costs.cost(4) == 0.020 and costs.cost(8) == pytest.approx(0.028) and costs.cost(20) == pytest.approx(0.052)
    assert costs.cost(1) == 0.020  # below the least seen: never cheaper than it
    costs.observe(16, 0.030)  # noise: more rows seen cheaper
    assert costs.cost(24) == pytest.approx(0.036)  # the slope is never negative


def test_a_drafter_that_costs_a_forward_a_token_drafts_less_than_a_free_one():
    likely = gains(0.8, 0.8, 0.8)
    assert batch_lengths([likely, likely], 2, memory_bound, [0.0, 0.0]) == [3, 3]
    assert batch_lengths([likely, likely], 2, memory_bound, [0.0, 2.0]) == [3, 1]  # its drafts cost more than rows
    assert batch_lengths([likely, likely], 2, memory_bound, [0.0, 40.0]) == [3, 0]
