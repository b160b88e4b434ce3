"""The one harness of bench and calibration (measure/interleaved.py): the warm-up first, every arm on
every trial, the order rotated one place per trial, progress counted over all runs."""

from specdec_cli.measure.interleaved import rotated, run_interleaved


def test_the_warm_up_runs_first_then_every_arm_on_every_trial_in_a_rotated_order():
    seen, counted = [], []
    run_interleaved(["p0", "p1", "p2", "p3"], ["k0", "k2", "k4"], lambda trial, arm: seen.append(f"{trial} {arm}"),
                    warm_up=lambda: seen.append("warm-up"), progress=lambda done, total: counted.append((done, total)))
    assert seen == ["warm-up", "p0 k0", "p0 k2", "p0 k4", "p1 k2", "p1 k4", "p1 k0", "p2 k4", "p2 k0", "p2 k2",
                    "p3 k0", "p3 k2", "p3 k4"]
    assert counted == [(done, 12) for done in range(1, 13)]


def test_rotation_wraps_around_the_arms():
    assert rotated(["a", "b"], 0) == ["a", "b"] and rotated(["a", "b"], 3) == ["b", "a"]
    assert rotated(("a",), 5) == ["a"]
