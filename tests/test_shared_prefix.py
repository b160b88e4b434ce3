"""Prompts of a batch that begin alike compute their common beginning once (decoding/shared_prefix.py):
the copied positions are bit for bit what the prompt's own forward computes, every answer stays its
own plain decoding's, and a prompt waits a step where a prompt joining with it would give it more."""

from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_llama

from specdec_cli.decoding.drafters.head import HeadDrafter
from specdec_cli.decoding.drafters.lookup import NgramDrafter
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.head_network import DraftHead, head_config
from specdec_cli.decoding.kv import reserved_cache
from specdec_cli.decoding.shared_prefix import DEFER_FROM, copy_prefix, plan_sharing
from specdec_cli.pairs.cache_dir import cache_root
from specdec_cli.runtime import native_kernels
from specdec_cli.runtime.lean_forward import Block, forward_many
from specdec_cli.runtime.lean_install import use_lean_forward
from specdec_cli.runtime.quantize import quantise_model
from specdec_cli.runtime.rowwise_attention import NATIVE_ROWWISE_UP_TO, use_rowwise_attention

EOS = {1}


@pytest.fixture(scope="module")
def target():
    assert native_kernels.available(cache_root()), "specdec's kernels do not build here"
    model = quantise_model(tiny_llama(seed=31, hidden=64, layers=2), "int8", native=True)
    use_rowwise_attention(model)
    assert use_lean_forward(model) and forward_many(model).shares_prefixes
    return model


def ids(seed: int, n: int) -> list[int]:
    return torch.randint(2, 98, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def prompt(tokens: list[int]):
    return SimpleNamespace(tokens=torch.tensor(tokens), prompt_length=len(tokens))


def test_a_prompt_copies_the_longest_cached_prefix_and_waits_for_a_longer_one_joining_now():
    base = ids(1, 90)
    cached = [prompt(base[:20] + [3] * 10), prompt(base[:40] + [4] * 10)]
    leader = prompt(base + [5])
    follower = prompt(base + [6])  # would share 40 with the cache, 90 with the leader next step
    near = prompt(base[:50] + [7])  # 40 + 10: too little to wait for
    short = prompt(base[:3])  # caches 2 positions, all of them the cached prompt's
    everyone = [leader, follower, near, short, *cached]
    place = {id(p): i for i, p in enumerate(everyone)}
    named = lambda plan: [(place[id(p)], s and place[id(s)], n) for p, s, n in plan]  # noqa: E731
    assert named(plan_sharing([leader, follower, near, short], cached, limit=128)) == [(0, 5, 40), (2, 5, 40), (3, 4, 2)]
    # limited to the positions every forward attends row by row: waiting would gain less than DEFER_FROM
    assert named(plan_sharing([leader, follower], cached, limit=40 + DEFER_FROM - 1)) == [(0, 5, 40), (1, 5, 40)]


@pytest.mark.cpu_kernels  # run again on AVX2's kernels (test_cpu_paths.py)
def test_a_prompts_first_positions_are_the_same_bits_whatever_follows_them(target):
    """What sharing rests on: the positions below rowwise_up_to, cached by a long prompt (its rest in one
    causal call) and by a short one (all row by row), and the same positions' last-row logits."""
    tokens = torch.tensor(ids(2, NATIVE_ROWWISE_UP_TO + 70))
    caches = []
    with torch.inference_mode():
        for n in (NATIVE_ROWWISE_UP_TO + 70, NATIVE_ROWWISE_UP_TO, 50):
            cache = reserved_cache(target.config)
            target(tokens[None, :n], cache=cache, use_cache=True, logits_to_keep=1)
            caches.append(cache)
    for cache in caches[1:]:
        n = cache.get_seq_length()
        for mine, theirs in zip(cache.layers, caches[0].layers):
            assert torch.equal(mine.keys, theirs.keys[..., :n, :]) and torch.equal(mine.values, theirs.values[..., :n, :])


def alone(target, tokens, budget):
    engine = SpeculativeEngine(target, None, EOS)
    return [t for e in engine.generate(tokens, k=0, max_new_tokens=budget) for t in e.emitted]


@pytest.mark.cpu_kernels
@pytest.mark.parametrize("drafter", ["plain", "ngram", "head"])
def test_batched_prompts_that_share_a_beginning_are_each_their_own_plain_decoding(target, drafter):
    base = ids(3, 150)
    prompts = [base[:60] + ids(4, 9), base[:60] + ids(5, 30), base + ids(6, 5), base + ids(7, 40), base[:61],
               [9], base[:30] + ids(8, 3)]
    budgets = [12, 6, 9, 14, 8, 5, 7]
    chosen = {"plain": None, "ngram": NgramDrafter(), "head": HeadDrafter(DraftHead(head_config(target)), target)}[drafter]
    engine = SpeculativeEngine(target, chosen, EOS)
    requests = [engine.request(p, k=0 if chosen is None else 3, max_new_tokens=n, key=i)
                for i, (p, n) in enumerate(zip(prompts, budgets))]
    answers = {}
    for request, event in engine.run(iter(requests), batch=3):
        answers.setdefault(request.key, []).extend(event.emitted)
    assert [answers[i] for i in range(len(prompts))] == [alone(target, p, n) for p, n in zip(prompts, budgets)]
    # the second and third wait a step for the first (60 positions), the fourth copies the third's
    # positions below rowwise_up_to, the fifth all its prompt caches, the sixth nothing, the seventh 30
    assert [r.shared for r in requests] == [0, 60, 60, NATIVE_ROWWISE_UP_TO - 1, 60, 0, 30]


@pytest.mark.cpu_kernels
@pytest.mark.parametrize("shared", [NATIVE_ROWWISE_UP_TO - 1, NATIVE_ROWWISE_UP_TO])
def test_a_prompts_rest_after_a_copied_beginning_caches_what_its_own_forward_does_below_the_limit(target, shared):
    """Copied up to rowwise_up_to, a prompt's rest is no longer a prompt's forward (lean_forward.is_prompt):
    its rows attend row by row, where its own forward attends them in one causal call, and the
    positions after the copy round differently. One position less, and the rest is a prompt's again."""
    tokens = torch.tensor(ids(9, 240))
    own, _ = SpeculativeEngine(target, None, EOS).prompt_cache(tokens)
    copied = reserved_cache(target.config)
    copy_prefix(own, copied, shared)
    forward_many(target).forward_many([Block(tokens[shared:-1], copied, keep=1)])
    same = all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values) for a, b in zip(own.layers, copied.layers))
    assert same == (shared < NATIVE_ROWWISE_UP_TO)


@pytest.mark.cpu_kernels
def test_the_same_long_prompt_twice_in_a_batch_is_each_time_its_own_plain_decoding(target):
    long, shorter = ids(9, 240), ids(10, 180)
    prompts = [long, long, shorter, shorter]
    engine = SpeculativeEngine(target, None, EOS)
    requests = [engine.request(p, k=0, max_new_tokens=6, key=i) for i, p in enumerate(prompts)]
    answers = {}
    for request, event in engine.run(iter(requests), batch=4):
        answers.setdefault(request.key, []).extend(event.emitted)
    assert [answers[i] for i in range(len(prompts))] == [alone(target, p, 6) for p in prompts]
    assert [r.shared for r in requests] == [0, NATIVE_ROWWISE_UP_TO - 1, 0, NATIVE_ROWWISE_UP_TO - 1]
