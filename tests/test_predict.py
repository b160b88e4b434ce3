"""`specdec predict`: the formula, the break-even and the rules' relation on given costs (exact numbers),
and the command's exit codes, refusals and output on the tiny pairs. No timing figure is asserted: the
verify curve is given, and the drafter's measured cost is only checked to enter the formula as printed."""

import json
import math

import pytest
from typer.testing import CliRunner

from conftest import one_line_error
from specdec_cli.cli import app
from specdec_cli.decoding.control.speedup import predicted_speedup
from specdec_cli.measure.prediction import (
    LEAST_CONTEXT,
    MOST_K,
    chosen,
    cost_per_token,
    other_rule_alpha,
    RoundCosts,
    predict,
    race_alpha,
    round_curve,
    rules_differ,
    spread,
    standard_alpha,
    typical_context,
)

COSTS = {n: 0.010 + 0.002 * (n - 1) for n in range(1, MOST_K + 2)}  # seconds of a block of n rows: verify(K) = 1 + 0.2·K


def test_limits_match_what_the_block_timer_measures():
    from specdec_cli.decoding import blocks

    assert MOST_K == blocks.MEASURED_LENGTHS - 1 and LEAST_CONTEXT == blocks.SHORT_CONTEXT


def test_speedup_and_break_even_on_given_costs():
    k1, k2 = predict(0.5, 0.1, {1: 1.2, 2: 1.4})
    assert (k1.k, k2.k) == (1, 2)
    assert k1.speedup == pytest.approx(1.5 / 1.3, abs=1e-12)  # (1 + α) / (1.2 + 0.1)
    assert k2.speedup == pytest.approx(1.75 / 1.6, abs=1e-12)  # (1 + α + α²) / (1.4 + 0.2)
    assert k1.break_even_alpha == pytest.approx(0.3, abs=1e-5)  # 1 + α = 1.3
    assert k2.break_even_alpha == pytest.approx((math.sqrt(3.4) - 1) / 2, abs=1e-5)  # 1 + α + α² = 1.6
    for p in (k1, k2):  # at its break-even, K just pays
        assert predicted_speedup(p.break_even_alpha, p.k, 0.1, p.verify_cost) == pytest.approx(1.0, abs=1e-5)


def test_a_k_that_cannot_pay_has_no_break_even_and_is_not_chosen():
    (only,) = predict(1.0, 0.2, {1: 1.9})  # a round costs 2.1 plain steps and yields at most 2 tokens
    assert only.break_even_alpha is None and only.speedup == pytest.approx(2 / 2.1)
    verdict = chosen([only])
    assert (verdict.verdict, verdict.k, verdict.best_k) == ("off", 0, 1)


def test_the_chosen_k_is_the_best_predicted():
    predictions = predict(0.8, 0.05, {1: 1.1, 2: 1.2, 3: 1.3, 4: 1.9})
    best = max(predictions, key=lambda p: p.speedup)
    verdict = chosen(predictions)
    assert best.k == 3 and (verdict.verdict, verdict.k, verdict.speedup) == ("speculate", 3, best.speedup)


def test_the_rules_relation_and_its_inverse():
    assert race_alpha(0.5) == pytest.approx(1 / 3)  # 1 − TV = 0.5: the race keeps 0.5 / 1.5
    assert standard_alpha(1 / 3) == pytest.approx(0.5)
    assert (race_alpha(0.0), race_alpha(1.0), standard_alpha(1.0)) == (0.0, 1.0, 1.0)
    assert other_rule_alpha(0.6, "exact") == pytest.approx(0.75) and other_rule_alpha(0.75, "standard") == pytest.approx(0.6)
    assert all(race_alpha(a) <= a for a in (0.1, 0.5, 0.9))  # the race never keeps more
    assert rules_differ(0.7, True) and not rules_differ(0.0, True) and not rules_differ(0.7, False)


def test_the_curve_is_scaled_to_what_the_rounds_paid():
    rounds = RoundCosts(plain=1.05, top_k=2, top_verify=1.6, other=0.05)  # the rounds paid 0.6 where a tight loop shows 0.4
    curve = round_curve({1: 1.2, 2: 1.4}, rounds)
    assert curve[2] == pytest.approx((1.6 + 0.05) / 1.05)  # the top K is what its rounds paid
    assert curve[1] == pytest.approx((1.3 + 0.05) / 1.05)  # half the rise, as in the timed curve
    flat = round_curve({1: 1.0, 2: 1.0}, RoundCosts(plain=1.0, top_k=2, top_verify=1.4, other=0.0))
    assert flat == {1: pytest.approx(1.2), 2: pytest.approx(1.4)}  # a flat timed curve: the rise by rows
    unseen = round_curve({1: 1.2, 2: 1.4}, RoundCosts(plain=1.0, top_k=2, top_verify=None, other=0.0))
    assert unseen == {1: pytest.approx(1.2), 2: pytest.approx(1.4)}  # no round drafted K: the timed curve stands


def test_a_sample_spreads_over_the_file():
    lines = list(range(80))  # ten scenarios of eight, in order
    assert spread(lines, 8) == [0, 10, 20, 30, 40, 50, 60, 70]
    assert spread(lines, 3) == [0, 26, 53] and spread(lines, 200) == lines and spread([], 4) == []


def test_typical_context_and_cost_per_token():
    assert typical_context([40, 60], 64, 64, 1000) == 64  # 50 + 32 = 82 → 2^6
    assert typical_context([100], 64, 64, 1000) == 128  # 132 → 2^7
    assert typical_context([3000], 64, 64, 1000) == 1000 and typical_context([], 64, 64, 1000) == 64
    assert cost_per_token(0.2, 10, 0.01) == pytest.approx(2.0) and cost_per_token(0.0, 0, 0.01) == 0.0


# --- the command ------------------------------------------------------------------------------------


@pytest.fixture
def given_curve(monkeypatch):
    """The verify curve as COSTS says, so that no test times (nor keeps) a block."""
    from specdec_cli.decoding import blocks

    monkeypatch.setattr(blocks, "block_passes", lambda model, lengths, reps, context: [dict(COSTS)] * reps)


def run(models, *args):
    return CliRunner().invoke(app, ["predict", "--models", models, *args])


@pytest.mark.parametrize("args, message", [
    ([], "give --alpha A (an acceptance rate you know) or --prompts FILE"),
    (["--alpha", "0.5", "--prompts", "p.txt"], "give --alpha A"),
    (["--alpha", "1.5"], "--alpha must be from 0 to 1, got 1.5"),
    (["--alpha", "nan"], "--alpha must be from 0 to 1, got nan"),
    (["--alpha", "0.5", "--k", "0..4"], "--k values must be from 1 to 9"),
    (["--alpha", "0.5", "--k", "1..12"], "--k values must be from 1 to 9"),
    (["--alpha", "0.5", "--k", "x"], "--k takes a range like 0..8"),
    (["--alpha", "0.5", "--accept", "lenient:2"], "--accept 'lenient:2': predict covers the lossless rules, exact or standard"),
    (["--prompts", "p.txt", "--accept", "standard"], "--accept names the rule of --alpha; with --prompts both rules are measured"),
    (["--alpha", "0.5", "--sample", "3"], "--sample counts the prompts of --prompts; --alpha samples none"),
    (["--prompts", "p.txt", "--sample", "0"], "--sample must be at least 1, got 0"),
    (["--alpha", "0.5", "--context", "0"], "--context must be at least 1, got 0"),
    (["--alpha", "0.5", "--temperature", "-1"], "--temperature must be 0 or more"),
])
def test_bad_options_are_one_line_refusals(models, args, message):
    assert one_line_error(run(models, *args)).startswith(message)


def test_help_says_what_it_predicts():
    result = CliRunner().invoke(app, ["predict", "--help"])
    assert result.exit_code == 0
    assert "break-even" in result.output and "--alpha" in result.output and "--prompts" in result.output


def test_a_context_the_target_cannot_hold_is_refused(models, given_curve):
    message = one_line_error(run(models, "--alpha", "0.5", "--context", "250"))
    assert message == "--context 250: the target holds 256 tokens, so at most 246 with a block of 10 after them"


def check_formula(result: dict) -> None:
    """Every printed speed-up and break-even is the formula's on the printed α, c, verify curve and
    rounds (the curve scaled to the rounds, over a plain round); the choice is the best."""
    rounds = result["rounds"]
    top = COSTS[rounds["k"] + 1] / COSTS[1]
    c = result["c"] / rounds["plain"]
    for rule, figure in result["alpha"].items():
        speeds = {}
        for row in result["per_k"]:
            k = row["k"]
            assert row["verify_cost"] == pytest.approx(COSTS[k + 1] / COSTS[1], abs=1e-4)
            paid = top - 1 if rounds["verify"] is None else rounds["verify"] - 1
            scaled = 1 + (row["verify_cost"] - 1) / (top - 1) * paid
            assert row["round_cost"] == pytest.approx((scaled + rounds["other"]) / rounds["plain"], rel=1e-3)
            expected = predicted_speedup(figure["value"], k, c, row["round_cost"])
            assert row["speedup"][rule] == pytest.approx(expected, rel=1e-3, abs=1e-4)  # printed to 4 places
            speeds[k] = row["speedup"][rule]
            even = row["break_even_alpha"]  # where K just pays; None: not even at α = 1
            at = predicted_speedup(1.0 if even is None else even, k, c, row["round_cost"])
            assert at < 1 + 1e-3 if even is None else at == pytest.approx(1.0, abs=1e-3)
        choice = result["choice"][rule]
        assert choice["best_k"] == max(speeds, key=lambda k: (speeds[k], k))
        assert choice["verdict"] == ("speculate" if max(speeds.values()) >= 1 else "off")


def test_a_given_alpha_under_greedy_is_the_same_for_both_rules(models, given_curve):
    result = run(models, "--alpha", "0.6", "--k", "1..4", "--max-new-tokens", "4", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["rules_differ"] is False and out["sampled"] is None and out["context"] == 246
    assert out["alpha"] == {"exact": {"value": 0.6, "from": "given"}, "standard": {"value": 0.6, "from": "given"}}
    assert [row["k"] for row in out["per_k"]] == [1, 2, 3, 4]
    check_formula(out)


def test_a_given_alpha_under_sampling_derives_the_other_rule(models, given_curve):
    result = run(models, "--alpha", "0.75", "--accept", "standard", "--temperature", "0.8", "--k", "1,3",
                 "--max-new-tokens", "4", "--context", "64", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["rules_differ"] is True and out["context"] == 64
    assert out["alpha"]["standard"] == {"value": 0.75, "from": "given"}
    assert out["alpha"]["exact"] == {"value": 0.6, "from": "derived from standard's"}
    check_formula(out)


def test_sampled_acceptance_measures_both_rules_for_a_draft_model(models, given_curve, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("abcabcabc\nhello hello\nxyz\n")
    result = run(models, "--prompts", str(prompts), "--sample", "2", "--temperature", "0.8", "--k", "1..3",
                 "--max-new-tokens", "8", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["drafter"] == "model" and out["rules_differ"] is True
    assert out["sampled"]["prompts"] == 2 and out["sampled"]["k"] == 3
    assert set(out["sampled"]["judged"]) == {"exact", "standard"} and min(out["sampled"]["judged"].values()) > 0
    assert {figure["from"] for figure in out["alpha"].values()} == {"measured"}
    assert out["context"] == LEAST_CONTEXT and out["c"] > 0
    check_formula(out)


def test_the_table_names_the_rule_and_the_choice(models, given_curve, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("abcabcabc\n")
    result = run(models, "--pair", "tiny-ngram", "--prompts", str(prompts), "--k", "1..2", "--max-new-tokens", "8")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("tiny-ngram · drafter ngram · 64 cached tokens · greedy")
    assert any(line.startswith("α ") and "under exact, measured at K=2 on 1 prompt(s)" in line
               and line.endswith("; greedy: the same under both rules") for line in lines)
    assert any(line.split()[:4] == ["K", "verify", "round", "break-even"] for line in lines)
    assert any(line.startswith("a plain round ") and ("a round at K=2 verified in " in line or "no round drafted 2" in line)
               for line in lines)
    assert lines[-1].startswith("exact: ") and "speed-up standard" not in result.stdout


def test_plot_writes_an_image(models, given_curve, tmp_path):
    pytest.importorskip("matplotlib")
    image = tmp_path / "out" / "predict.png"
    result = run(models, "--alpha", "0.6", "--temperature", "0.5", "--k", "1..3", "--max-new-tokens", "4", "--plot", str(image))
    assert result.exit_code == 0, result.output
    assert image.read_bytes().startswith(b"\x89PNG")


def test_help_and_refusals_answer_without_torch(models):
    import subprocess
    import sys

    script = ("import sys\nfrom typer.testing import CliRunner\nfrom specdec_cli.cli import app\n"
              "for args in (['predict', '--help'], ['predict', '--models', sys.argv[1], '--alpha', '2']):\n"
              "    CliRunner().invoke(app, args)\n"
              "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", script, models], check=True)


def test_a_disordered_verify_curve_is_refused_not_predicted_from(models, monkeypatch):
    from specdec_cli.decoding import blocks

    skewed = {**COSTS, 2: COSTS[1] * 0.5}  # two rows clearly cheaper than one: what a busy moment gives
    monkeypatch.setattr(blocks, "block_passes", lambda model, lengths, reps, context: [dict(skewed)] * reps)
    message = one_line_error(run(models, "--alpha", "0.5"))
    assert message.startswith("the verify blocks' timings came out disordered three times")
