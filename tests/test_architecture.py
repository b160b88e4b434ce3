"""Which forward a target runs, told from its files before it is loaded (`specdec models`), and the
reason an architecture is not run lean."""

from __future__ import annotations

import json
from types import SimpleNamespace

import gguf
import numpy as np
import pytest

from specdec_cli.pairs.architecture import forward_of, gguf_architecture
from specdec_cli.pairs.sources import ModelSource
from specdec_cli.runtime.lean_architectures import refusal


def write_gguf(path, architecture: str) -> None:
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("architecture, forward", [("gemma3", "lean"), ("qwen3", "lean"), ("gpt2", "transformers")])
def test_a_ggufs_architecture_is_read_from_its_header(tmp_path, architecture, forward):
    path = tmp_path / "model.gguf"
    write_gguf(path, architecture)
    assert gguf_architecture(path) == architecture
    assert forward_of(ModelSource.parse(str(path)), "int4") == forward
    assert forward_of(ModelSource.parse(str(path)), "float32") == "transformers"  # lean runs quantised targets only


def test_a_file_that_is_no_gguf_is_unknown(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGML" + bytes(100))
    assert gguf_architecture(path) is None
    assert forward_of(ModelSource.parse(str(path)), "int4") == "unknown"


def test_a_directorys_config_decides(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "rope_parameters": {"rope_type": "dynamic"}}))
    assert forward_of(ModelSource.parse(str(tmp_path)), "int8") == "transformers"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "rope_parameters": {"rope_type": "llama3"}}))
    assert forward_of(ModelSource.parse(str(tmp_path)), "int8") == "lean"


@pytest.mark.parametrize("config, reason", [
    (dict(model_type="gpt_neox"), "the lean forward does not cover 'gpt_neox' models (it runs gemma2, gemma3_text, llama, "
                                  "mistral, phi3, qwen2, qwen3)"),
    (dict(model_type="llama", rope_parameters={"rope_type": "longrope"}),
     "its longrope rope changes with a forward's longest position, so a verify block's rows would not score as one-token forwards"),
    (dict(model_type="phi3", rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5}),
     "its rope turns only part of each head, so a verify block's rows would not score as one-token forwards"),
    (dict(model_type="gemma3_text", rope_parameters={"full_attention": {"rope_type": "linear"},
                                                     "sliding_attention": {"rope_type": "default"}}), None),
])
def test_the_reason_an_architecture_runs_transformers_forward(config, reason):
    assert refusal(SimpleNamespace(**config)) == reason


def test_a_target_the_lean_forward_does_not_run_is_named_once_at_load(tmp_path):
    from typer.testing import CliRunner

    from conftest import char_tokenizer, tiny_llama
    from specdec_cli.cli import app

    model = tiny_llama(5, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    model.save_pretrained(tmp_path / "target")
    char_tokenizer().save_pretrained(tmp_path / "target")
    result = CliRunner().invoke(app, ["generate", "--target", str(tmp_path / "target"), "--draft", "ngram", "--dtype", "int8",
                                      "-k", "0", "--max-new-tokens", "2", "--json", "abc"])
    assert result.exit_code == 0, result.output
    assert result.output.count("this llama target runs transformers' forward with specdec's linears inside, not specdec's "
                               "lean one (slower per token): its dynamic rope changes with a forward's longest position") == 1
    assert json.loads(result.stdout)["stats"]["computed_by"]["forward"] == "transformers"
