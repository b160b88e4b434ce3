"""q/k/v and gate/up as one weight-only matmul: the same logits, bit for bit, as one matmul each."""

import copy
from dataclasses import replace

import pytest
import torch
from conftest import tiny_llama
from test_dtype import block_and_one_token_logits

from specdec_cli.runtime.fused_projections import ProjectionSlice, SharedProjection
from specdec_cli.pairs.loading import load
from specdec_cli.runtime.quantize import Int4Linear, Int8Linear, int4_groups, int8_per_channel, quantise_model
from specdec_cli.pairs.registry import load_registry
from specdec_cli.runtime.rowwise_attention import use_rowwise_attention

pytestmark = pytest.mark.cpu_kernels  # run again on AVX2's kernels (test_cpu_paths.py)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 5, 17])
def test_stacked_weights_give_each_sibling_exactly_its_own_output_at_the_real_model_shapes(kind, rows):
    torch.manual_seed(0)
    weights = [torch.randn(576, 576), torch.randn(192, 576), torch.randn(192, 576)]  # SmolLM2-135M's q, k, v
    x = torch.randn(rows, 576, dtype=torch.bfloat16)
    if kind == "int4":
        alone = [Int4Linear(*int4_groups(w), None, torch.bfloat16) for w in weights]
        fused = Int4Linear(*(torch.cat(p) for p in zip(*(int4_groups(w) for w in weights))), None, torch.bfloat16)
    else:
        alone = [Int8Linear(*int8_per_channel(w), None, torch.bfloat16) for w in weights]
        fused = Int8Linear(*int8_per_channel(torch.cat(weights)), None, torch.bfloat16)
    assert torch.equal(fused(x), torch.cat([linear(x) for linear in alone], dim=-1))


def quantised(model, kind, fuse):
    model = quantise_model(copy.deepcopy(model), kind, fuse=fuse)
    use_rowwise_attention(model)
    return model


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_fused_model_gives_the_unfused_logits_bit_for_bit(kind):
    model = tiny_llama(seed=3, hidden=64, layers=2)
    fused, unfused = quantised(model, kind, True), quantised(model, kind, False)
    attention = fused.model.layers[0].self_attn
    assert isinstance(attention.q_proj, ProjectionSlice) and isinstance(attention.qkv_proj, SharedProjection)
    assert isinstance(fused.model.layers[1].mlp.gate_up_proj, SharedProjection)
    assert not any(isinstance(m, ProjectionSlice) for m in unfused.modules())
    ids = torch.randint(3, 98, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert torch.equal(fused(ids).logits, unfused(ids).logits)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_the_fused_target_still_scores_a_verify_block_exactly_as_one_token_forwards(pair_dir, dtype):
    model = load(replace(load_registry(pair_dir / "models.yaml").pair("tiny").target, dtype=dtype)).model
    assert any(isinstance(m, SharedProjection) for m in model.modules())  # what the loader gives is fused
    ids = torch.randint(3, 98, (1, 40), generator=torch.Generator().manual_seed(0))
    block, one = block_and_one_token_logits(model, ids, 33)
    assert torch.equal(block, one)


def test_a_shared_projection_computes_afresh_for_a_new_input_and_lets_go_once_all_slices_read():
    shared = SharedProjection(torch.nn.Linear(4, 6, bias=False), readers=2)
    a, b = ProjectionSlice(shared, 0, 0, 2), ProjectionSlice(shared, 1, 2, 6)
    x, y = torch.randn(1, 4), torch.randn(1, 4)
    assert torch.equal(a(x), shared.linear(x)[:, :2])
    assert torch.equal(b(y), shared.linear(y)[:, 2:])  # not x's kept output
    assert torch.equal(a(x), shared.linear(x)[:, :2]) and torch.equal(a(x), shared.linear(x)[:, :2])
    assert torch.equal(b(x), shared.linear(x)[:, 2:])
    assert shared._output is None
