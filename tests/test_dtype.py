"""Target precision: bfloat16, and weight-only int8 / int4 (an int4 GGUF's own blocks), on tiny models."""

import json
from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch
from conftest import tiny_llama
from gguf.quants import dequantize, quantize
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.decoding.blocks import cached_block_plan
from specdec_cli.runtime.gguf_int4 import decode_q4, gguf_int4_blocks, module_name
from specdec_cli.pairs.loading import load
from specdec_cli.pairs.profile import (
    PairProfile,
    ProfileWatcher,
    ScenarioProfile,
    drafter_identity,
    section_name,
    write_profile,
)
from specdec_cli.runtime.quantize import Int4Linear, Int8Linear, Q8Linear, dequantize_int4, int4_groups, output_weight
from specdec_cli.pairs.registry import load_registry

pytestmark = pytest.mark.cpu_kernels  # run again on AVX2's kernels (test_cpu_paths.py)

runner = CliRunner()
DTYPES = ["float32", "bfloat16", "int8", "int4"]
Q4 = {"Q4_0": gguf.GGMLQuantizationType.Q4_0, "Q4_1": gguf.GGMLQuantizationType.Q4_1}


def q4_bound(scale, minimum, weight):
    """The stated rounding: scale and zero (minimum + 8 scale) rounded to bfloat16 and the kernel's
    (q - 8) * scale + zero computed in bfloat16: 2^-8 of |8 scale| + |zero| + |weight|."""
    zero = minimum + 8 * scale
    per_group = 2.0**-8 * (8 * scale.abs() + zero.abs())
    return per_group.repeat_interleave(32, dim=1) + 2.0**-8 * weight.abs()


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_gguf_blocks_decode_to_exactly_what_gguf_dequantises_and_the_kernel_stays_within_the_rounding(kind):
    weight = np.random.default_rng(0).normal(size=(48, 96)).astype(np.float32)
    raw = quantize(weight, Q4[kind])
    q, scale, minimum = decode_q4(raw, kind)
    expected = torch.from_numpy(dequantize(raw, Q4[kind]))
    assert torch.equal(dequantize_int4(q, scale, minimum), expected)  # the blocks as they are, nothing re-quantised
    linear = Int4Linear(q, scale, minimum, None, torch.bfloat16)
    error = (linear.dequantized() - expected).abs()
    assert (error <= q4_bound(scale, minimum, expected)).all()
    assert error.max() > 0  # bfloat16 scales do round: the bound is the claim, not equality


def test_gguf_tensors_are_matched_to_their_modules_through_reordered_rows(tmp_path):
    model = tiny_llama(seed=7)
    q_proj = model.model.layers[0].self_attn.q_proj
    raw = quantize(np.random.default_rng(1).normal(size=q_proj.weight.shape).astype(np.float32), Q4["Q4_1"])
    blocks = decode_q4(raw, "Q4_1")
    values = torch.from_numpy(dequantize(raw, Q4["Q4_1"]))
    order = torch.randperm(values.shape[0], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        q_proj.weight.copy_(values[order])  # the conversion reorders rows (llama's q/k permutation)
        model.model.layers[0].self_attn.k_proj.weight.add_(1.0)  # matches nothing in the file
    writer = gguf.GGUFWriter(tmp_path / "tiny.gguf", "llama")
    writer.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=Q4["Q4_1"])
    writer.add_tensor("blk.0.attn_k.weight", quantize(np.zeros((16, 32), np.float32), Q4["Q4_1"]), raw_dtype=Q4["Q4_1"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    found = gguf_int4_blocks(tmp_path / "tiny.gguf", model)
    assert set(found) == {"model.layers.0.self_attn.q_proj"}
    assert all(torch.equal(a, b[order]) for a, b in zip(found["model.layers.0.self_attn.q_proj"], blocks))
    assert module_name("blk.12.ffn_down.weight") == "model.layers.12.mlp.down_proj" and module_name("output.weight") == "lm_head"


def test_int4_from_float_keeps_every_group_within_half_a_step():
    weight = torch.randn(32, 64)
    q, scale, minimum = int4_groups(weight)
    assert q.min() >= 0 and q.max() <= 15
    step = scale.repeat_interleave(32, dim=1)
    assert ((dequantize_int4(q, scale, minimum) - weight).abs() <= step / 2 + 1e-6).all()


@pytest.mark.parametrize("dtype", ["int8", "int4"])
@pytest.mark.parametrize("kernels", ["specdec", "torch"])
def test_quantised_load_replaces_every_linear_and_keeps_the_float_lm_head_for_drafters(pair_dir, dtype, kernels,
                                                                                      monkeypatch):
    if kernels == "torch":
        monkeypatch.setenv("SPECDEC_TORCH_KERNELS", "1")
    spec = load_registry(pair_dir / "models.yaml").pair("tiny").target
    plain = load(spec).model
    loaded = load(replace(spec, dtype=dtype))
    linears = [m for m in loaded.model.modules() if isinstance(m, (torch.nn.Linear, Int8Linear, Int4Linear, Q8Linear))]
    if kernels == "torch":
        assert linears and all(isinstance(m, Int8Linear if dtype == "int8" else Int4Linear) for m in linears)
    else:
        assert linears and all(isinstance(m, Q8Linear) and m.bits == int(dtype[3:]) for m in linears)
    assert loaded.precision == dtype and loaded.model.dtype == torch.float32  # only the linears' weights are compressed
    assert torch.equal(output_weight(loaded.model), plain.lm_head.weight)


def generate(pair_dir, *args):
    result = runner.invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--max-new-tokens", "16",
                                 "--json", *args, "abcabcabc"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.splitlines()[0])["token_ids"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("drafter", [["--pair", "tiny"], ["--pair", "tiny-alt", "--drafter", "head"], ["--pair", "tiny-alt"]])
def test_every_dtype_generates_and_speculation_equals_plain_decoding_at_that_dtype(pair_dir, dtype, drafter):
    plain = generate(pair_dir, *drafter, "--dtype", dtype, "-k", "0")
    assert len(plain) == 16
    assert generate(pair_dir, *drafter, "--dtype", dtype, "-k", "4") == plain


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "int4"])
def test_verify_equivalence_passes_at_the_dtype_it_was_asked_for(pair_dir, tmp_path, dtype):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("abcabcabc\nhello there\n")
    result = runner.invoke(app, ["verify-equivalence", "--models", str(pair_dir / "models.yaml"), "--prompts", str(prompts),
                                 "-k", "1,4", "--max-new-tokens", "12", "--dtype", dtype, "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["dtype"] == dtype and record["equivalent"]


def test_an_unknown_dtype_is_a_one_line_error(pair_dir):
    result = runner.invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--dtype", "int3", "x"])
    assert result.exit_code == 2
    assert "specdec: error: unknown dtype 'int3'; choose one of auto, float32, float16, bfloat16, int8, int4" in result.output


def test_block_costs_are_cached_per_dtype(pair_dir, tmp_path, monkeypatch):
    """Each dtype's costs are measured once and read back after; another dtype's are never taken for them."""
    from specdec_cli.decoding import blocks

    model = load(load_registry(pair_dir / "models.yaml").pair("tiny").target).model
    measured = []
    costs = {"target float32": {1: 0.010, 2: 0.011}, "target int4": {1: 0.004, 2: 0.009}}
    monkeypatch.setattr(blocks, "time_blocks", lambda m, context: costs[measured[-1]])
    for identity in ("target float32", "target int4", "target int4", "target float32"):
        measured.append(identity)
        assert blocks.cached_costs(model, identity, tmp_path) == costs[identity]
    measured.clear()  # from the files alone now: a measurement would fail (measured[-1])
    assert blocks.cached_costs(model, "target int4", tmp_path) == costs["target int4"]
    assert len(list(tmp_path.glob("block-costs-*.json"))) == 2
    assert cached_block_plan(model, "target int4", tmp_path) == blocks.block_plan(costs["target int4"])


def test_profiles_are_kept_and_used_per_target_dtype(pair_dir, tmp_path):
    pair = load_registry(pair_dir / "models.yaml").pair("tiny")
    at_int4 = replace(pair, target=replace(pair.target, dtype="int4"))
    section = ScenarioProfile(k=2, verdict="speculate", best_k=2, speedup=1.5, alpha=0.7, c=0.1)
    path = tmp_path / "profile.yaml"
    write_profile(path, PairProfile(pair=section_name(at_int4), calibrated="now", target=str(pair.target.source),
                                    draft=str(pair.drafter.model.source), scenarios={"default": section}, dtype="int4",
                                    drafter=drafter_identity(at_int4)))
    assert section_name(pair) == "tiny" and section_name(at_int4) == "tiny@int4"
    assert ProfileWatcher(path, at_int4).profile.scenarios["default"] == section
    assert ProfileWatcher(path, pair).profile is None  # float32 finds no section of its own
    assert not ProfileWatcher(path, at_int4).profile.matches(pair)


def block_and_one_token_logits(model, ids, start):
    from transformers import DynamicCache

    from specdec_cli.decoding.kv import crop_cache

    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(ids[:, :start], cache=cache, use_cache=True)
        block = model(ids[:, start:], cache=cache, use_cache=True).logits[0]
        crop_cache(cache, start)
        one = torch.cat([model(ids[:, i : i + 1], cache=cache, use_cache=True).logits[0] for i in range(start, ids.shape[1])])
    return block, one


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_a_verify_block_scores_every_position_exactly_as_one_token_forwards(pair_dir, dtype):
    model = load(replace(load_registry(pair_dir / "models.yaml").pair("tiny").target, dtype=dtype)).model
    ids = torch.randint(3, 98, (1, 40), generator=torch.Generator().manual_seed(0))
    block, one = block_and_one_token_logits(model, ids, 33)
    assert torch.equal(block, one)  # bit for bit, not within a tolerance


def test_block_costs_measured_under_other_forward_code_are_measured_again(pair_dir, tmp_path, monkeypatch):
    from specdec_cli.decoding import blocks

    model = load(load_registry(pair_dir / "models.yaml").pair("tiny").target).model
    cached_block_plan(model, "target int4", tmp_path)
    monkeypatch.setattr(blocks, "forward_code", lambda: "a later lean forward")
    cached_block_plan(model, "target int4", tmp_path)
    assert len(list(tmp_path.glob("block-costs-*.json"))) == 2
