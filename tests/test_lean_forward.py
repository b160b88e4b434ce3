"""The lean forward of quantised Llama targets: the logits, caches and hidden states of transformers'
forward bit for bit, for one token, verify blocks, trees and prompts, and the loader installs it."""

import copy
import json
from dataclasses import replace

import pytest
import torch
from conftest import tiny_llama
from transformers import DynamicCache
from typer.testing import CliRunner

from specdec_cli.cli import app
from specdec_cli.decoding.kv import crop_cache, keep_positions
from specdec_cli.decoding.tree import Tree, verify_tree
from specdec_cli.runtime import lean_forward
from specdec_cli.runtime.lean_forward import LeanLlama, fallback_forwards
from specdec_cli.runtime.lean_install import use_lean_forward
from specdec_cli.runtime.lean_weights import supported
from specdec_cli.pairs.loading import load
from specdec_cli.runtime.quantize import quantise_model
from specdec_cli.pairs.registry import load_registry
from specdec_cli.runtime.rowwise_attention import use_rowwise_attention

pytestmark = pytest.mark.cpu_kernels  # run again on AVX2's kernels (test_cpu_paths.py)


def pair(kind):
    """(transformers' forward, the lean forward) over the same quantised weights."""
    model = quantise_model(tiny_llama(seed=3, hidden=64, layers=3), kind)
    use_rowwise_attention(model)
    lean = copy.copy(model)  # shares every module; only its forward differs
    assert use_lean_forward(lean)
    assert isinstance(lean.forward.__self__, LeanLlama) and not isinstance(model.forward.__self__, LeanLlama)
    return model, lean


def run(model, ids, cache, **kwargs):
    return model(ids, cache=cache, use_cache=True, **kwargs)


def caches_equal(a, b):
    return all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values) for x, y in zip(a.layers, b.layers))


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_lean_logits_and_caches_equal_the_transformers_forward_bit_for_bit(kind):
    model, lean = pair(kind)
    ids = torch.randint(3, 98, (1, 90), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        caches = DynamicCache(config=model.config), DynamicCache(config=model.config)
        for start, stop in ((0, 70), (70, 71), (71, 72), (72, 77), (77, 78), (78, 90)):  # a long prompt, tokens, blocks
            outs = [run(m, ids[:, start:stop], c, logits_to_keep=1 if stop - start > 1 else 0)
                    for m, c in zip((model, lean), caches)]
            assert torch.equal(outs[0].logits, outs[1].logits), (start, stop)
            assert caches_equal(*caches)
        assert torch.equal(model(ids[:, :40]).logits, lean(ids[:, :40]).logits)  # no cache, every row


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("selection", [-1, [1, -1], [0, 2], True])
def test_hidden_states_of_the_chosen_layers_equal_transformers(kind, selection):
    model, lean = pair(kind)
    ids = torch.randint(3, 98, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        want, got = (m(ids, output_hidden_states=selection).hidden_states for m in (model, lean))
    assert len(want) == len(got) == 4
    for a, b in zip(want, got):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_tree_mask_and_kept_path_give_transformers_logits_and_cache(kind):
    model, lean = pair(kind)
    ids = torch.randint(3, 98, (1, 20), generator=torch.Generator().manual_seed(2))
    tree = Tree(torch.tensor([5, 17, 23, 40, 41, 9]), (-1, 0, 0, 1, 2, 2))
    with torch.inference_mode():
        caches = DynamicCache(config=model.config), DynamicCache(config=model.config)
        outs = []
        for m, cache in zip((model, lean), caches):
            m(ids, cache=cache, use_cache=True)
            outs.append(verify_tree(m, cache, tree, torch.device("cpu"), output_hidden_states=-1))
            keep_positions(cache, torch.tensor([*range(20), 20, 22, 25]))
        assert torch.equal(outs[0].logits, outs[1].logits)
        assert torch.equal(outs[0].hidden_states[-1], outs[1].hidden_states[-1])
        assert caches_equal(*caches)
        follow = [run(m, torch.tensor([[7]]), c).logits for m, c in zip((model, lean), caches)]
        assert torch.equal(*follow)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_the_loader_installs_it_unless_told_not_to_and_a_block_scores_exactly_as_one_token_forwards(pair_dir, dtype, monkeypatch):
    spec = replace(load_registry(pair_dir / "models.yaml").pair("tiny").target, dtype=dtype)
    monkeypatch.setenv("SPECDEC_LEAN_FORWARD", "0")
    assert not isinstance(getattr(load(spec).model.forward, "__self__", None), LeanLlama)
    monkeypatch.delenv("SPECDEC_LEAN_FORWARD")
    model = load(spec).model
    assert isinstance(model.forward.__self__, LeanLlama)
    ids = torch.randint(3, 98, (1, 45), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(ids[:, :30], cache=cache, use_cache=True)
        block = model(ids[:, 30:], cache=cache, use_cache=True).logits[0]
        crop_cache(cache, 30)
        one = torch.cat([model(ids[:, i : i + 1], cache=cache, use_cache=True).logits[0] for i in range(30, 45)])
    assert torch.equal(block, one)


def test_what_it_does_not_cover_runs_transformers_forward_and_is_counted():
    model, lean = pair("int4")
    ids = torch.randint(3, 98, (1, 80), generator=torch.Generator().manual_seed(6))
    with torch.inference_mode():
        embeds = model.model.embed_tokens(ids[:, :6])
        assert torch.equal(lean(inputs_embeds=embeds).logits, model(inputs_embeds=embeds).logits)
        batch = ids[:, :6].repeat(2, 1)
        assert torch.equal(lean(batch).logits, model(batch).logits)
        assert fallback_forwards(lean) == 2 and fallback_forwards(model) == 0
        long = lean(ids, logits_to_keep=1).logits  # a long prompt on an empty cache, without dense copies: still lean
        assert fallback_forwards(lean) == 2
        assert torch.allclose(long, model(ids, logits_to_keep=1).logits, atol=1e-4)
        cache = DynamicCache(config=model.config)
        lean(ids[:, :10], cache=cache, use_cache=True)
        lean(ids[:, 10:], cache=cache, use_cache=True)  # 70 rows on a cache: longer than a verify block
        assert fallback_forwards(lean) == 3
    assert not supported(tiny_llama(seed=3, hidden=64))  # float linears: not the lean forward's
    assert not supported(quantise_model(tiny_llama(seed=3, hidden=64), "int4", fuse=False))


def test_a_run_that_leaves_the_lean_forward_counts_every_such_forward_and_warns_once(pair_dir, monkeypatch, tmp_path):
    monkeypatch.setattr(lean_forward, "ROWWISE_UP_TO", 0)  # every forward on a cache now leaves the lean forward,
    monkeypatch.setattr(lean_forward, "NATIVE_ROWWISE_UP_TO", 0)  # on either attention
    monkeypatch.setenv("SPECDEC_DENSE_PREFILL", "1")  # and every prompt shorter than the dense copies take, on any CPU
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("abc\nxyz\n")
    common = ["--models", str(pair_dir / "models.yaml"), "--pair", "tiny", "--dtype", "int8", "--max-new-tokens", "6"]
    result = CliRunner().invoke(app, ["bench", *common, "--prompts", str(prompts), "--modes", "plain,spec:2", "--json"])
    assert result.exit_code == 0, result.output
    modes = json.loads(result.stdout)["modes"]
    # bench's target carries transformers' model (loaded at the start): every round's forward, and
    # each short prompt's (shorter than the dense copies take), ran there and was counted
    assert [modes[m]["fallback_forwards"] - modes[m]["rounds"] for m in ("plain", "spec:2")] == [2, 2]
    warnings = [line for line in result.stderr.splitlines() if "fallback_forwards" in line]
    assert warnings == [f"specdec: warning: target forwards ran transformers' forward instead of the lean int8/int4 one "
                        f"(slower): plain {modes['plain']['fallback_forwards']}, spec:2 {modes['spec:2']['fallback_forwards']}; "
                        "fallback_forwards counts them"]
    # generate's target has no transformers model to fall back on: such a call is refused, not built mid-run
    refused = CliRunner().invoke(app, ["generate", *common, "--json", "-k", "2"], input="abc\n")
    assert isinstance(refused.exception, RuntimeError)
    assert str(refused.exception).startswith("the lean forward does not run this call")
