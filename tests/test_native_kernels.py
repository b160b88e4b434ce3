"""specdec's own int8-activation matmul (runtime/native_kernels.py): its layout is exact, each row's
result is the same bits whatever the rows, threads or CPU path beside it, a verify block of the lean
forward on it scores every row exactly as one-token forwards do, and where it cannot run the target
says so and runs torch's kernels."""

import copy
import logging

import pytest
import torch
from conftest import tiny_llama
from transformers import DynamicCache

from specdec_cli.pairs.cache_dir import cache_root
from specdec_cli.runtime import native_kernels
from specdec_cli.runtime.lean_install import use_lean_forward
from specdec_cli.runtime.quantize import Int4Linear, Q8Linear, int4_groups, quantise_model
from specdec_cli.runtime.rowwise_attention import use_rowwise_attention

pytestmark = pytest.mark.cpu_kernels  # run again on AVX2's kernels (test_cpu_paths.py)


@pytest.fixture(autouse=True, scope="module")
def kernels_loaded():
    assert native_kernels.available(cache_root()), "specdec's kernels do not build here"


def weights(bits: int, outputs: int = 40, inputs: int = 96, seed: int = 0):
    """Random codes, scales and offsets; 40 outputs: the last tile is padded."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2**bits, (outputs, inputs), generator=g)
    scale = torch.rand(outputs, inputs // 32, generator=g) * 0.02 + 0.001
    offset = -scale * 2 ** (bits - 1) * torch.rand(outputs, inputs // 32, generator=g)
    return codes, scale, offset


@pytest.mark.parametrize("bits", [4, 8])
def test_the_packed_layout_unpacks_to_the_weights_it_was_given(bits):
    codes, scale, offset = weights(bits)
    packed = native_kernels.pack(codes, scale, offset, bits)
    assert packed[0].shape == (3, 3, 256 if bits == 4 else 512)
    want = (codes.float().view(40, 3, 32) * scale[..., None] + offset[..., None]).view(40, 96)
    got = native_kernels.unpack(*packed, bits)
    assert torch.equal(got[:40], want) and torch.equal(got[40:], torch.zeros(8, 96))


@pytest.mark.parametrize("bits", [4, 8])
def test_activations_on_the_int8_grid_give_the_exact_product(bits):
    """Each block of x is d · (integer codes, one of them ±127): its int8 codes are exact, so the
    kernel's result is the float64 product up to float32 rounding: a misplaced weight would not be."""
    codes, scale, offset = weights(bits)
    g = torch.Generator().manual_seed(1)
    x_codes = torch.randint(-127, 128, (5, 96), generator=g)
    x_codes[:, ::32] = 127
    x = (x_codes.float().view(5, 3, 32) * torch.tensor([0.5, 0.25, 2.0])[None, :, None]).view(5, 96)
    w = (codes.double().view(40, 3, 32) * scale.double()[..., None] + offset.double()[..., None]).view(40, 96)
    got = native_kernels.bound().matmul(x, *native_kernels.pack(codes, scale, offset, bits), bits)[:, :40]
    torch.testing.assert_close(got.double(), x.double() @ w.t(), rtol=1e-5, atol=1e-4)


def run_rows(x, packed, bits, avx512):
    return torch.ops.specdec.q8_matmul(x.contiguous(), *packed, bits, avx512)


@pytest.mark.parametrize("bits", [4, 8])
def test_every_row_is_bit_identical_alone_in_any_block_and_on_any_thread_count(bits):
    packed = native_kernels.pack(*weights(bits, outputs=64, inputs=128), bits)
    x = torch.randn(16, 128, generator=torch.Generator().manual_seed(2)) * 3
    avx512 = native_kernels.avx512()
    alone = torch.cat([run_rows(x[i : i + 1], packed, bits, avx512) for i in range(16)])
    for rows in range(1, 17):
        assert torch.equal(run_rows(x[:rows], packed, bits, avx512), alone[:rows]), rows
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(run_rows(x, packed, bits, avx512), alone)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_a_prompts_long_block_gives_every_row_its_bits_alone(bits):
    """A long block is quantised by several threads and goes through the tiles a chunk of rows at a
    time (64 rows at 1,536 inputs): every row, a NaN row among them, is still its own bits alone."""
    g = torch.Generator().manual_seed(bits)
    group = 16 if bits == 6 else 32
    codes = torch.randint(0, 64 if bits == 6 else 2**bits, (48, 1536), generator=g)
    scale = torch.rand(48, 1536 // group, generator=g) * 0.02 + 0.001
    packed = native_kernels.pack(codes, scale, -scale * torch.rand(48, 1536 // group, generator=g), bits)
    x = torch.randn(203, 1536, generator=g)
    x[130, 700] = float("nan")
    avx512 = native_kernels.avx512()
    alone = torch.cat([run_rows(x[i : i + 1], packed, bits, avx512) for i in range(203)])
    assert alone[130].isnan().all() and not alone[129].isnan().any()
    for rows in (203, 64, 65, 137):
        assert torch.equal(run_rows(x[:rows], packed, bits, avx512).nan_to_num(), alone[:rows].nan_to_num()), rows


@pytest.mark.parametrize("bits", [4, 8])
def test_the_avx2_and_avx512_paths_give_the_same_bits(bits):
    if not native_kernels.avx512():
        pytest.skip("this run's CPU path has no AVX-512 VNNI")
    packed = native_kernels.pack(*weights(bits, outputs=48, inputs=576), bits)
    x = torch.randn(9, 576, generator=torch.Generator().manual_seed(3))
    assert torch.equal(run_rows(x, packed, bits, True), run_rows(x, packed, bits, False))


@pytest.mark.parametrize("bits, multiple", [(4, -8.0), (4, None), (6, -32.0), (8, -128.0), (8, None)])
def test_scales_kept_in_float16_and_offsets_kept_as_a_multiple_give_the_float32_layouts_bits(bits, multiple):
    """A GGUF block's own d and m (float16; Q4_0's and Q8_0's offsets a multiple of d) are stored as
    compactly as the file's block, and the kernel computes exactly what it does from float32 copies."""
    g = torch.Generator().manual_seed(bits)
    group = 16 if bits == 6 else 32
    codes = torch.randint(0, 64 if bits == 6 else 2**bits, (40, 256), generator=g)
    scale = (torch.rand(40, 256 // group, generator=g) * 0.02 + 1e-4).half().float()
    offset = scale * multiple if multiple else (torch.randn(40, 256 // group, generator=g) * 0.1).half().float()
    codes_packed, small_scale, small_offset = native_kernels.pack(codes, scale, offset, bits)
    assert small_scale.dtype == torch.float16
    assert torch.equal(small_offset, torch.tensor([multiple])) if multiple else small_offset.dtype == torch.float16
    wide = (small_scale.float(), small_scale.float() * multiple if multiple else small_offset.float())
    weights = (codes.float().view(40, -1, group) * scale[..., None] + offset[..., None]).view(40, 256)
    assert torch.equal(native_kernels.unpack(codes_packed, small_scale, small_offset, bits)[:40], weights)
    x = torch.randn(9, 256, generator=g)
    for avx512 in [False, True] if native_kernels.avx512() else [False]:
        got = run_rows(x, (codes_packed, small_scale, small_offset), bits, avx512)
        assert torch.equal(got, run_rows(x, (codes_packed, *wide), bits, avx512)), avx512
    if bits == 4 and multiple:  # Q4_0's 18 bytes per 32 weights, as the file holds them
        stored = codes_packed.numel() + small_scale.numel() * 2
        assert stored == 40 * 256 * 18 // 32 + 8 * 256 * 18 // 32  # the last tile's 8 padding rows included


def test_scales_that_float16_cannot_hold_stay_float32():
    codes, scale, offset = weights(4)
    _, kept_scale, kept_offset = native_kernels.pack(codes, scale, offset, 4)
    assert kept_scale.dtype == kept_offset.dtype == torch.float32 and kept_offset.shape == (3, 3, 16)


def test_a_zero_block_and_rows_of_zeros_give_the_offsets_alone():
    codes, scale, offset = weights(4)
    x = torch.zeros(2, 96)
    x[1, 32:64] = 1.0  # block 1 only
    got = native_kernels.bound().matmul(x, *native_kernels.pack(codes, scale, offset, 4), 4)[:, :40]
    assert torch.equal(got[0], torch.zeros(40))
    w = codes[:, 32:64].double() * scale[:, 1:2].double() + offset[:, 1:2].double()
    torch.testing.assert_close(got[1].double(), w.sum(1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dim", [16, 64, 128])  # 64 and 128 take the wide AVX-512 paths, others the generic one
def test_attention_rows_are_the_exact_softmax_and_bit_identical_alone_in_a_block_or_beside_other_answers(dim):
    g = torch.Generator().manual_seed(7)
    keys = torch.randn(3, 130, dim, generator=g)[:, :120]  # a cache view: rows of keys 130 apart
    values = torch.randn(3, 130, dim, generator=g)[:, :120]
    q = torch.randn(16, 9, dim, generator=g)
    counts = torch.arange(105, 121)
    many = native_kernels.op("attend_rows")  # answers' lists: one answer each here, several below
    attend = lambda q, k, v, c, i, scale, cpu: many([q], [k], [v], [c], [i], scale, cpu)  # noqa: E731
    avx512 = native_kernels.avx512()
    block = attend(q, keys, values, counts, None, 0.3, avx512)
    for row in range(16):
        alone = attend(q[row : row + 1], keys, values, counts[row : row + 1], None, 0.3, avx512)
        assert torch.equal(alone[0], block[row]), row
        tail = attend(q[row:], keys, values, counts[row:].contiguous(), None, 0.3, avx512)
        assert torch.equal(tail, block[row:]), row
        k, v = keys.repeat_interleave(3, 0)[:, : counts[row]].double(), values.repeat_interleave(3, 0)[:, : counts[row]].double()
        weights = (torch.einsum("hd,hkd->hk", q[row].double(), k) * 0.3).softmax(-1)
        torch.testing.assert_close(block[row].double(), torch.einsum("hk,hkd->hd", weights, v), rtol=1e-5, atol=1e-6)
    # a tree's rows gather their keys (an index): the same values in the same order give the same bits
    index = torch.arange(120).flip(0)[None].expand(2, -1).contiguous()
    gathered = attend(q[:2], keys, values, torch.tensor([120, 120]), index, 0.3, avx512)
    assert torch.equal(gathered, attend(q[:2], keys.flip(1), values.flip(1), torch.tensor([120, 120]), None, 0.3, avx512))
    # several answers in one call (batched decoding), each on its own cache, one a tree: each answer's bits alone
    other_keys, other_values = torch.randn(3, 40, dim, generator=g), torch.randn(3, 40, dim, generator=g)
    together = many([q[:16], q[3:4], q[:2], q[4:7]], [keys, other_keys, keys, other_keys], [values, other_values, values, other_values],
                    [counts, torch.tensor([40]), torch.tensor([120, 120]), torch.arange(38, 41)], [None, None, index, None],
                    0.3, avx512)
    assert torch.equal(together, torch.cat([block, attend(q[3:4], other_keys, other_values, torch.tensor([40]), None, 0.3, avx512),
                                            gathered, attend(q[4:7], other_keys, other_values, torch.arange(38, 41), None, 0.3, avx512)]))


@pytest.mark.parametrize("dim", [16, 64, 128])
def test_scores_far_below_the_best_weigh_nothing_and_a_nan_row_stays_nan_alone(dim):
    # sharp queries put most scores past exp's cut-off (87 below the best), in the 16-wide body and the
    # tail of each row's keys; a NaN query row attends to NaN, and the rows beside it keep their bits
    g = torch.Generator().manual_seed(11)
    keys, values = torch.randn(3, 100, dim, generator=g), torch.randn(3, 100, dim, generator=g)
    q = 320 / dim**0.5 * torch.randn(6, 9, dim, generator=g)  # scores of spread ~40
    counts = torch.tensor([100, 99, 37, 16, 17, 3])
    attend = native_kernels.op("attend_rows")
    avx512 = native_kernels.avx512()
    got = attend([q], [keys], [values], [counts], [None], 0.125, avx512)
    for row, count in enumerate(counts.tolist()):
        k, v = keys.repeat_interleave(3, 0)[:, :count].double(), values.repeat_interleave(3, 0)[:, :count].double()
        scores = torch.einsum("hd,hkd->hk", q[row].double(), k) * 0.125
        assert (scores < scores.amax(-1, keepdim=True) - 87).any() or count < 4
        # scores of ~100 carry float32's rounding into the weights: a lane mixed up would be off by ~1
        torch.testing.assert_close(got[row].double(), torch.einsum("hk,hkd->hd", scores.softmax(-1), v), rtol=1e-4, atol=1e-5)
    poisoned = q.clone()
    poisoned[2, 0, 0] = float("nan")
    with_nan = attend([poisoned], [keys], [values], [counts], [None], 0.125, avx512)
    assert with_nan[2, 0].isnan().all() and not with_nan[2, 1:].isnan().any()
    assert torch.equal(with_nan[:2], got[:2]) and torch.equal(with_nan[3:], got[3:])


def lean_native(kind):
    model = quantise_model(tiny_llama(seed=3, hidden=256, layers=2), kind, native=True)  # head_dim 64
    assert any(isinstance(m, Q8Linear) for m in model.modules())
    assert not any(isinstance(m, Int4Linear) for m in model.modules())
    use_rowwise_attention(model)
    lean = copy.copy(model)
    assert use_lean_forward(lean)
    return model, lean


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_a_verify_block_on_the_kernel_scores_every_row_as_one_token_forwards_do(kind):
    model, lean = lean_native(kind)
    ids = torch.randint(3, 98, (1, 46), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        lean(ids[:, :30], cache=cache, use_cache=True, logits_to_keep=1)
        one_token = torch.stack([lean(ids[:, t : t + 1], cache=cache, use_cache=True).logits[0, -1] for t in range(30, 46)])
        for length in range(2, 17):
            cache = DynamicCache(config=model.config)
            lean(ids[:, :30], cache=cache, use_cache=True, logits_to_keep=1)
            block = lean(ids[:, 30 : 30 + length], cache=cache, use_cache=True).logits[0]
            assert torch.equal(block, one_token[:length]), length
        # transformers' forward on the same modules: the same bits
        want, got = model(ids[:, :20]).logits, lean(ids[:, :20]).logits
        assert torch.equal(want, got)


@pytest.mark.parametrize("lean", [False, True])
def test_the_ops_are_bound_when_the_model_is_built_not_looked_up_per_call(monkeypatch, lean):
    """Both forwards, transformers' (rowwise attention, Q8Linear.forward) and the lean one, and a
    verify block: none asks the library for an op by name once the model exists."""
    model, lean_model = lean_native("int8")
    model = lean_model if lean else model

    def looked_up(*args):
        raise AssertionError("an op was looked up during a forward")

    monkeypatch.setattr(native_kernels, "op", looked_up)
    monkeypatch.setattr(native_kernels, "avx512", looked_up)
    ids = torch.randint(3, 98, (1, 12), generator=torch.Generator().manual_seed(8))
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(ids[:, :8], cache=cache, use_cache=True)
        assert model(ids[:, 8:12], cache=cache, use_cache=True).logits.shape == (1, 4, 98)


def test_the_kernels_weights_are_the_gguf_blocks_exactly():
    weight = torch.randn(24, 64, generator=torch.Generator().manual_seed(5))
    groups = int4_groups(weight)
    linear = Q8Linear.from_int4(*groups)
    want = (groups[0].float().view(24, 2, 32) * groups[1][..., None] + groups[2][..., None]).view(24, 64)
    assert torch.equal(linear.dequantized(), want)


def test_a_compiler_that_fails_is_named_with_its_last_words(tmp_path, monkeypatch):
    compiler = tmp_path / "bin" / "cxx"  # GCC-compatible by its macros, failing on the sources
    compiler.parent.mkdir()
    compiler.write_text('#!/bin/sh\ncase "$*" in *-dM*) echo "#define __GNUC__ 13";; *) echo "error: boom" >&2; exit 1;; esac\n')
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    with pytest.raises(native_kernels.Unavailable, match=f"compiling specdec's kernels failed \\({compiler}\\): error: boom"):
        native_kernels.build(tmp_path / "out" / "k.so")
    assert not list((tmp_path / "out").iterdir())  # no half-written library left


def test_without_the_kernel_the_target_says_so_once_and_runs_torchs(monkeypatch, caplog):
    def unavailable(cache):
        raise native_kernels.Unavailable("no C++ compiler found")
    monkeypatch.setattr(native_kernels, "load", unavailable)
    monkeypatch.setattr(native_kernels, "_told", [])
    with caplog.at_level(logging.WARNING, logger="specdec"):
        assert native_kernels.available(cache_root()) is False
        assert native_kernels.available(cache_root()) is False
    told = [r.getMessage() for r in caplog.records if "int8 matmul kernel" in r.getMessage()]
    assert told == ["specdec's int8 matmul kernel is not available (no C++ compiler found): the target runs on "
                    "torch's int4/int8 kernels, whose verify blocks cost more"]


@pytest.mark.parametrize("lean", [False, True])
def test_a_tree_on_the_kernels_scores_each_node_as_one_token_forwards_along_its_path(lean):
    """A tree's rows gather their ancestors (an index per row) where a chain's see their prefix: on
    specdec's attention op both must still give the one-token forward's bits."""
    from specdec_cli.decoding.tree import Tree, verify_tree

    model, lean_model = lean_native("int4")
    model = lean_model if lean else model
    tree = Tree(torch.tensor([5, 17, 23, 40, 41, 9, 12]), (-1, 0, 0, 1, 2, 2, 5))
    prompt = torch.randint(3, 98, (1, 20), generator=torch.Generator().manual_seed(6))

    def prefilled():
        cache = DynamicCache(config=model.config)
        model(prompt, cache=cache, use_cache=True)
        return cache

    with torch.inference_mode():
        tree_logits = verify_tree(model, prefilled(), tree, torch.device("cpu")).logits[0]
        for leaf in (3, 4, 6):
            cache = prefilled()
            for node in tree.path_to(leaf):
                step = model(torch.tensor([[int(tree.tokens[node])]]), cache=cache, use_cache=True).logits[0, -1]
                assert torch.equal(tree_logits[node], step), (leaf, node)


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_a_weight_quantised_in_pieces_is_stored_as_one(kind, monkeypatch):
    """A big output layer is quantised a few thousand rows at a time; each piece's compact storage is
    joined into the whole's (one multiple, one dtype), and the result is the weight quantised at once."""
    from specdec_cli.runtime import quantize

    weight = torch.randn(80, 64, generator=torch.Generator().manual_seed(9))
    whole = quantize.native_linear(weight, kind)
    monkeypatch.setattr(quantize, "ROWS_AT_ONCE", 32)
    pieces = quantize.native_linear(weight, kind)
    assert pieces.scale.dtype == torch.float16 and (kind == "int4" or pieces.offset.tolist() == [-128.0])
    for a, b in zip((pieces.codes, pieces.scale, pieces.offset), (whole.codes, whole.scale, whole.offset)):
        assert a.dtype == b.dtype and torch.equal(a, b)
    x = torch.randn(3, 64)
    assert torch.equal(pieces(x), whole(x))
