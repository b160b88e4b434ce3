"""`generate --batch N`: piped prompts decoded together give each prompt its own plain decoding's
tokens, in input order, with a bad line failing alone in its place; the option is checked before any
model loads, and a target without the lean forward is refused a batch (its default is 1)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from specdec_cli.cli import app

runner = CliRunner()
LONG = "x" * 300  # one token a character: past the tiny target's 256-token context
PROMPTS = ["first prompt", "a second, longer prompt that runs on", "third", "the fourth one", "fifth and last"]


def generate(models: str, lines: str, *options: str):
    return runner.invoke(app, ["generate", "--models", models, "--json", *options], input=lines)


def records(result) -> list[dict]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_batched_answers_are_each_prompts_plain_decoding_in_input_order(models):
    lines = "".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(PROMPTS))
    lines += f"{LONG}\n"  # a bad line in the middle of a batch fails alone, in its place
    lines += json.dumps({"id": "last", "prompt": "one more after it"}) + "\n"
    batched = generate(models, lines, "--dtype", "int8", "--batch", "3", "-k", "3", "--max-new-tokens", "12")
    assert batched.exit_code == 1, batched.output
    got = records(batched)
    assert [r["id"] for r in got] == ["p0", "p1", "p2", "p3", "p4", 6, "last"]
    assert got[5] == {"id": 6, "line": 6, "error": "the prompt is 300 tokens; the target's context holds 256"}
    assert max(r["stats"]["batch"]["max"] for r in got if "stats" in r) == 3
    assert all(r["stats"]["batch"]["size"] == 3 for r in got if "stats" in r)
    plain = records(generate(models, lines, "--dtype", "int8", "--batch", "1", "-k", "0", "--max-new-tokens", "12"))
    assert [r.get("token_ids") for r in got] == [r.get("token_ids") for r in plain]
    assert all("batch" not in r.get("stats", {}) for r in plain)


def test_a_sampled_batch_keeps_each_prompts_seeded_text(models):
    lines = "".join(p + "\n" for p in PROMPTS)
    options = ("--dtype", "int8", "--temperature", "0.8", "--seed", "5", "--max-new-tokens", "10")
    batched = records(generate(models, lines, *options, "--batch", "4", "-k", "2"))
    alone = records(generate(models, lines, *options, "--batch", "1", "-k", "0"))
    assert [r["token_ids"] for r in batched] == [r["token_ids"] for r in alone]


def test_the_batch_option_is_checked_before_any_model_loads(models, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("x\n")
    for value, message in (("0", "--batch must be at least 1, got 0"), ("65", "--batch must be at most 64, got 65")):
        result = generate(models, "x\n", "--batch", value)
        assert result.exit_code == 2 and result.stderr.strip() == f"specdec: error: {message}"
        verify = runner.invoke(app, ["verify-equivalence", "--prompts", str(prompts), "--models", models, "--batch", value])
        assert verify.exit_code == 2 and verify.stderr.strip() == f"specdec: error: {message}"


def test_a_target_on_transformers_forward_is_refused_a_batch_and_defaults_to_one(models):
    refused = generate(models, "first\nsecond\n", "--batch", "2", "--max-new-tokens", "3")
    assert refused.exit_code == 2 and refused.stderr == ("specdec: error: decoding 2 prompts at once needs specdec's lean "
                                                         "forward (Llama-architecture targets on int8/int4 kernels); this "
                                                         "target runs transformers' forward, one prompt at a time\n")
    assert "Traceback" not in refused.output
    default = generate(models, "first\nsecond\n", "--max-new-tokens", "3")
    assert default.exit_code == 0 and default.stderr == "" and len(records(default)) == 2


def test_verify_equivalence_checks_batched_runs_and_refuses_what_cannot_batch(models, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(p + "\n" for p in PROMPTS))
    result = runner.invoke(app, ["verify-equivalence", "--prompts", str(prompts), "--models", models, "--dtype", "int8", "-k", "2,4",
                                 "--batch", "3", "--max-new-tokens", "10", "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert found["equivalent"] and found["batch"] == 3 and not found["divergences"]
    assert all(run["identical"] for run in found["runs"]) and len(found["runs"]) == 2 * len(PROMPTS)
    refused = runner.invoke(app, ["verify-equivalence", "--prompts", str(prompts), "--models", models, "--batch", "2"])
    assert refused.exit_code == 2 and "needs specdec's lean forward" in refused.stderr
    engine = runner.invoke(app, ["verify-equivalence", "--prompts", str(prompts), "--models", models, "--engine", "vllm", "--batch", "2"])
    assert engine.exit_code == 2 and "--batch" in engine.stderr


def test_prompts_that_begin_alike_compute_their_beginning_once_and_say_so(models):
    stem = "Answer in one word, and keep it short, please: "  # a character a token
    lines = "".join(json.dumps({"id": f"p{i}", "prompt": stem + tail}) + "\n" for i, tail in enumerate(["cats", "dogs", "owls"]))
    options = ("--dtype", "int8", "-k", "0", "--max-new-tokens", "8")
    batched = records(generate(models, lines, *options, "--batch", "3"))
    alone = records(generate(models, lines, *options, "--batch", "1"))
    assert [r["token_ids"] for r in batched] == [r["token_ids"] for r in alone]
    # the second and third wait a step for the first, then copy its cache of the stem: on specdec's
    # kernels with prompts on them; dense prompt copies (an AVX2 CPU's) share nothing
    ran = batched[0]["stats"]["computed_by"]
    shared = len(stem) if ran["kernels"].startswith("specdec-") and ran["prefill"] == "as decoding" else 0
    assert [r["stats"]["batch"]["prompt_shared"] for r in batched] == [0, shared, shared]
