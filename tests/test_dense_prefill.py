"""A quantised target's prompts on dense (bfloat16 or float32) weights (runtime/dense_prefill.py): taken
for a prompt and only for a prompt, close to the kernels' arithmetic, and decoding after it stays lossless."""

from dataclasses import replace

import pytest
import torch
from transformers import DynamicCache

from specdec_cli.decoding.drafters.lookup import NgramDrafter
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.measure.equivalence import reference_decode
from specdec_cli.runtime import dense_prefill
from specdec_cli.pairs.loading import load
from specdec_cli.pairs.registry import load_registry

pytestmark = pytest.mark.cpu_kernels  # run again on AVX2's kernels (test_cpu_paths.py)

PROMPT = torch.randint(3, 98, (1, 24), generator=torch.Generator().manual_seed(11))


def target(pair_dir, dtype, monkeypatch, dense: bool | str):
    monkeypatch.setenv("SPECDEC_DENSE_PREFILL", dense if isinstance(dense, str) else "1" if dense else "0")
    return load(replace(load_registry(pair_dir / "models.yaml").pair("tiny").target, dtype=dtype)).model


def prompt_logits(model, ids, **kwargs):
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        return model(ids, cache=cache, use_cache=True, **kwargs).logits[0, -1], cache


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["bfloat16", "float32"])
@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_a_prompt_runs_on_dense_weights_close_to_the_kernels(pair_dir, dtype, weights, monkeypatch):
    dense, exact = target(pair_dir, dtype, monkeypatch, weights), target(pair_dir, dtype, monkeypatch, False)
    layers = dense.forward.__self__.prompt_layers
    assert layers is not None and exact.forward.__self__.prompt_layers is None
    assert {w.dtype for w in dense_prefill.dense_weights(target(pair_dir, "float32", monkeypatch, False), getattr(torch, weights))[0]} == {getattr(torch, weights)}
    fast, _ = prompt_logits(dense, PROMPT, logits_to_keep=1)
    slow, _ = prompt_logits(exact, PROMPT, logits_to_keep=1)
    assert not torch.equal(fast, slow)  # another arithmetic ran...
    assert torch.allclose(fast, slow, atol=0.05 * float(slow.abs().max()))  # ...on the same weights
    below = dense_prefill.DENSE_FROM[getattr(torch, weights)] - 1  # too short to pay: the kernels' own forward
    short, _ = prompt_logits(dense, PROMPT[:, :below], logits_to_keep=1)
    assert torch.equal(short, prompt_logits(exact, PROMPT[:, :below], logits_to_keep=1)[0])
    assert not torch.equal(prompt_logits(dense, PROMPT[:, : below + 1], logits_to_keep=1)[0],
                           prompt_logits(exact, PROMPT[:, : below + 1], logits_to_keep=1)[0])


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_a_block_on_an_empty_cache_scores_every_row_exactly_as_one_token_forwards(pair_dir, dtype, monkeypatch):
    """A one-token prompt's first verify block sits on an empty cache too: it asks for every row's
    logits, so it is not a prompt, and each row must equal the one-token forward plain decoding runs."""
    model = target(pair_dir, dtype, monkeypatch, "bfloat16")  # dense from 8 rows: the 10-row block would qualify
    block = PROMPT[:, :10]
    with torch.inference_mode():
        whole = model(block, cache=DynamicCache(config=model.config), use_cache=True, logits_to_keep=10).logits[0]
        cache = DynamicCache(config=model.config)
        one = torch.cat([model(block[:, i : i + 1], cache=cache, use_cache=True).logits[0] for i in range(10)])
    assert torch.equal(whole, one)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_decoding_after_a_dense_prompt_is_lossless_and_transformers_continues_it_identically(pair_dir, dtype, monkeypatch):
    model = target(pair_dir, dtype, monkeypatch, True)
    plain = SpeculativeEngine(model, None, {1})
    lookup = SpeculativeEngine(model, NgramDrafter(), {1})
    for seed in range(4):
        ids = torch.randint(3, 98, (12 + 9 * seed,), generator=torch.Generator().manual_seed(seed)).tolist()
        expected = [t for event in plain.generate(ids, k=0, max_new_tokens=24) for t in event.emitted]
        for k in (1, 3, 6):
            assert [t for event in lookup.generate(ids, k=k, max_new_tokens=24) for t in event.emitted] == expected
        decoded, logits = reference_decode(plain, ids, 24, logits=True)
        assert decoded.tokens == expected
        first = next(iter(plain.generate(ids, k=0, max_new_tokens=1, record_logits=True))).logits[0]
        assert torch.equal(logits[0][0, : first.shape[0]].float(), first)  # on the very same prompt cache


def test_the_cpu_picks_the_prompt_weights_and_the_environment_overrides_it(monkeypatch):
    for setting, expected in (("0", None), ("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        monkeypatch.setenv("SPECDEC_DENSE_PREFILL", setting)
        assert [dense_prefill.dense_dtype(path) for path in ("avx512", "avx2", "")] == [expected] * 3
    monkeypatch.delenv("SPECDEC_DENSE_PREFILL")
    # CPUs as torch's probes describe them: what specdec's kernels run on, and what prompts then run on
    for name, cpu, avx512, avx2, torchs in (
            ("AMX", {"_is_amx_tile_supported", "_is_avx512_bf16_supported"}, torch.bfloat16, torch.bfloat16, torch.bfloat16),
            ("AVX-512 BF16, no AMX", {"_is_avx512_bf16_supported"}, None, torch.bfloat16, torch.bfloat16),
            ("neither (emulated bfloat16 is slow)", set(), None, torch.float32, torch.float32)):
        monkeypatch.setattr(dense_prefill, "supported", cpu.__contains__)
        assert [dense_prefill.dense_dtype(path) for path in ("avx512", "avx2", "")] == [avx512, avx2, torchs], name
        monkeypatch.setenv("SPECDEC_DENSE_PREFILL", "1")  # copies wherever, in the CPU's dtype
        assert dense_prefill.dense_dtype("avx512") == (torch.bfloat16 if cpu else torch.float32), name
        monkeypatch.delenv("SPECDEC_DENSE_PREFILL")
