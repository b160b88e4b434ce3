"""Several answers' blocks in one lean forward (batched decoding): every answer's logits, features and
cache are bit for bit what its own forward gives, whatever else shares the forward; prompts join it."""

import copy

import pytest
import torch
from conftest import tiny_llama

from specdec_cli.decoding.kv import reserved_cache
from specdec_cli.decoding.tree import Tree, tree_masks
from specdec_cli.pairs.cache_dir import cache_root
from specdec_cli.runtime import native_kernels
from specdec_cli.runtime.lean_forward import Block, forward_many
from specdec_cli.runtime.lean_install import use_lean_forward
from specdec_cli.runtime.quantize import quantise_model
from specdec_cli.runtime.rowwise_attention import use_rowwise_attention

pytestmark = pytest.mark.cpu_kernels  # run again on AVX2's kernels (test_cpu_paths.py)


def lean_model(kind):
    native = kind == "native"
    if native:
        assert native_kernels.available(cache_root()), "specdec's kernels do not build here"
    model = quantise_model(tiny_llama(seed=5, hidden=64, layers=3), "int8" if native else kind, native=native)
    use_rowwise_attention(model)
    assert use_lean_forward(model)
    return model


def caches_equal(a, b):
    return all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values) for x, y in zip(a.layers, b.layers))


def alone(model, cache, ids, **kwargs):
    return model(ids[None], cache=cache, use_cache=True, **kwargs)


@pytest.mark.parametrize("kind", ["int8", "int4", "native"])
def test_each_answer_of_a_batched_forward_is_its_own_forward_bit_for_bit(kind):
    model = lean_model(kind)
    many = forward_many(model)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 98, (n,), generator=g) for n in (90, 5, 40, 70)]  # long ones run as prompts
    mine = [reserved_cache(model.config) for _ in prompts]
    theirs = [reserved_cache(model.config) for _ in prompts]
    with torch.inference_mode():
        # The prompts together, then rounds of blocks of ragged lengths, with a prompt joining mid-way.
        steps = [[(0, prompts[0]), (1, prompts[1]), (2, prompts[2])]]
        for round_ in range(4):
            step = [(i, torch.randint(3, 98, (1 + (i + round_) % 5,), generator=g)) for i in range(3)]
            steps.append(step + ([(3, prompts[3])] if round_ == 1 else [(3, torch.randint(3, 98, (3,), generator=g))] if round_ > 1 else []))
        for step in steps:
            keep = [1 if mine[i].get_seq_length() == 0 else 0 for i, _ in step]
            batched = many.forward_many([Block(ids, mine[i], keep=k) for (i, ids), k in zip(step, keep)],
                                        output_hidden_states=[1, -1])
            for (i, ids), k, out in zip(step, keep, batched):
                own = alone(model, theirs[i], ids, logits_to_keep=k, output_hidden_states=[1, -1])
                assert torch.equal(out.logits, own.logits), (i, ids.shape)
                assert all(torch.equal(a, b) for a, b in zip(out.hidden_states, own.hidden_states) if a is not None)
                assert caches_equal(mine[i], theirs[i])


def test_a_tree_shares_the_forward_under_its_own_mask():
    model = lean_model("int8")
    many = forward_many(model)
    g = torch.Generator().manual_seed(8)
    tree = Tree(torch.randint(3, 98, (5,), generator=g), (-1, 0, 0, 1, 1))
    caches = [reserved_cache(model.config) for _ in range(4)]
    with torch.inference_mode():
        prompts = [torch.randint(3, 98, (12,), generator=g), torch.randint(3, 98, (9,), generator=g)]
        for cache, prompt in zip(caches, prompts * 2):
            alone(model, cache, prompt)
        chain = torch.randint(3, 98, (4,), generator=g)
        cached = caches[0].get_seq_length()
        mask = tree_masks(model.config, tree, cached, torch.bool)
        positions = cached + tree.depths()
        batched = many.forward_many([Block(tree.tokens, caches[0], positions, mask), Block(chain, caches[1])])
        own_tree = alone(model, caches[2], tree.tokens, attention_mask=mask, position_ids=positions[None])
        own_chain = alone(model, caches[3], chain)
    assert torch.equal(batched[0].logits, own_tree.logits) and torch.equal(batched[1].logits, own_chain.logits)


def test_a_block_it_cannot_share_is_refused_not_run_otherwise():
    model = lean_model("int8")
    cache = reserved_cache(model.config)
    with torch.inference_mode():
        alone(model, cache, torch.arange(3, 13))
        with pytest.raises(ValueError, match="cannot share a forward"):
            forward_many(model).forward_many([Block(torch.arange(3, 83), cache)])  # 80 rows on a cache
    assert forward_many(copy.copy(model)) is not None and forward_many(tiny_llama(seed=1)) is None
