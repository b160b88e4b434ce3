"""generate's stream goes on past a prompt it cannot answer: a line that is no prompt (malformed or
too deep JSON, no 'prompt', an id that JSON cannot carry) or a prompt longer than the context is one
line on stderr naming it and its line, its own error object in --json, and the next prompt runs; the
exit code (1) says that some failed. Every line --json writes is JSON."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from specdec_cli.cli import app

runner = CliRunner()
LONG = "x" * 300  # one token a character: past the tiny target's 256-token context


def strict(line: str):
    """json.loads that refuses NaN and Infinity, as JSON does (Python's parser takes them)."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(line, parse_constant=refuse)


def generate(models: str, lines: str, *options: str):
    return runner.invoke(app, ["generate", "--models", models, "--max-new-tokens", "3", *options], input=lines)


def test_an_over_long_prompt_fails_alone_and_the_prompts_after_it_run(models):
    """It ended the stream with exit 2: the good prompts after it never ran."""
    result = generate(models, f"first\n{LONG}\nlast\n", "--json")
    assert result.exit_code == 1, result.output
    first, error, last = [strict(line) for line in result.stdout.splitlines()]
    assert (first["prompt"], last["prompt"]) == ("first", "last")
    assert error == {"id": 2, "line": 2, "error": "the prompt is 300 tokens; the target's context holds 256"}
    assert result.stderr.splitlines() == ["specdec: error: prompt 2 (stdin line 2): the prompt is 300 tokens; "
                                          "the target's context holds 256"]
    alone = [strict(line) for line in generate(models, "first\nlast\n", "--json").stdout.splitlines()]
    assert [r["token_ids"] for r in alone] == [first["token_ids"], last["token_ids"]]  # the same tokens
    text = generate(models, f"first\n{LONG}\nlast\n")
    assert text.exit_code == 1 and text.stdout == generate(models, "first\nlast\n").stdout


def test_lines_that_are_no_prompt_fail_alone_each_with_its_error_object(models):
    """Malformed JSON or a line without a prompt ended the stream (exit 2); an id of 1e309 wrote
    `"id": Infinity`, which no JSON reader takes; 200k-deep nesting was a RecursionError traceback."""
    lines = ["first", "{not json", '{"id": 3}', '{"prompt": "x", "id": 1e309}', '{"prompt": "x", "id": NaN}',
             '{"prompt": "x", "id": [1]}', '{"prompt": "x", "id": ' + "[" * 200_000, "last"]
    result = generate(models, "\n".join(lines) + "\n", "--json")
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    records = [strict(line) for line in result.stdout.splitlines()]  # every line is JSON
    assert [r.get("prompt") for r in records] == ["first", None, None, None, None, None, None, "last"]
    errors = [
        (2, 2, "malformed JSON (Expecting property name enclosed in double quotes)"),
        (3, 3, "a JSON prompt line needs a non-empty string field 'prompt'"),
        (4, 4, "its 'id' must be a string or a finite number, not an infinite number"),
        (5, 5, "its 'id' must be a string or a finite number, not NaN"),
        (6, 6, "its 'id' must be a string or a finite number, not a list"),
        (7, 7, "JSON nested too deeply"),
    ]
    assert [tuple(r.values()) for r in records[1:-1]] == errors
    assert [r["id"] for r in (records[0], records[-1])] == [1, 8]  # the prompts keep their numbers
    assert result.stderr.splitlines() == [f"specdec: error: stdin line {line}: {error}" for _, line, error in errors]


def test_a_finite_id_is_kept_as_given(models):
    result = generate(models, '{"prompt": "x", "id": 1e300}\n{"prompt": "y", "id": "q-7"}\n', "--json")
    assert result.exit_code == 0, result.output
    assert [strict(line)["id"] for line in result.stdout.splitlines()] == [1e300, "q-7"]
