"""specdec's attention op for the engine's caches (attend_cached: one call a layer writes every answer's
new keys and values after its cached ones and attends): the bits of the cache updates and attend_rows
it stands for, and the lean forward on the engine's caches goes through it."""

import copy

import pytest
import torch
from conftest import tiny_llama
from transformers import DynamicCache

from specdec_cli.decoding.kv import reserved_cache
from specdec_cli.pairs.cache_dir import cache_root
from specdec_cli.runtime import native_kernels
from specdec_cli.runtime.lean_decoder import LeanDecoder
from specdec_cli.runtime.lean_install import use_lean_forward
from specdec_cli.runtime.quantize import quantise_model
from specdec_cli.runtime.rowwise_attention import row_keys, use_rowwise_attention

pytestmark = pytest.mark.cpu_kernels  # run again on AVX2's kernels (test_cpu_paths.py)

HEADS, KV_HEADS, DIM, ROOM = 9, 3, 64, 128


@pytest.fixture(autouse=True, scope="module")
def kernels_loaded():
    assert native_kernels.available(cache_root()), "specdec's kernels do not build here"


def test_the_op_writes_each_answers_rows_after_its_cached_ones_and_attends_as_attend_rows():
    g = torch.Generator().manual_seed(5)
    cached, rows = [40, 7, 100, 20], [1, 5, 2, 3]
    # the last answer is a tree: its second and third rows are siblings under the first
    seen = [None, None, None, [None, torch.cat([torch.arange(21), torch.tensor([21])]),
                               torch.cat([torch.arange(21), torch.tensor([22])])]]
    q = torch.randn(sum(rows), HEADS, DIM, generator=g)
    new = torch.randn(sum(rows), 2 * KV_HEADS, DIM, generator=g)
    k_new, v_new = new[:, :KV_HEADS], new[:, KV_HEADS:]  # views of one tensor, as the forward's
    buffers = [(torch.randn(KV_HEADS, ROOM, DIM, generator=g), torch.randn(KV_HEADS, ROOM, DIM, generator=g)) for _ in rows]
    before = copy.deepcopy(buffers)
    starts = [sum(rows[:i]) for i in range(len(rows))]
    keys, values, counts, indices, queries = [], [], [], [], []
    for (kb, vb), n, r, s, gathered in zip(before, cached, rows, starts, seen):
        keys.append(torch.cat([kb[:, :n], k_new[s : s + r].transpose(0, 1)], 1))
        values.append(torch.cat([vb[:, :n], v_new[s : s + r].transpose(0, 1)], 1))
        count, index = row_keys(gathered, r, n + r)
        counts.append(count)
        indices.append(index)
        queries.append(q[s : s + r])
    kernels = native_kernels.bound()
    want = kernels.attend_rows(queries, keys, values, counts, indices, DIM**-0.5)
    got = kernels.attend_cached(q, k_new, v_new, [b[0] for b in buffers], [b[1] for b in buffers], cached, counts, indices,
                                DIM**-0.5)
    assert torch.equal(got, want)
    for (kb, vb), (old_k, old_v), key, value, n, r in zip(buffers, before, keys, values, cached, rows):
        assert torch.equal(kb[:, : n + r], key) and torch.equal(vb[:, : n + r], value)
        assert torch.equal(kb[:, n + r :], old_k[:, n + r :]) and torch.equal(vb[:, n + r :], old_v[:, n + r :])


def test_rows_that_do_not_fit_a_buffer_are_refused_and_nothing_is_written():
    """The second answer's rows do not fit: the first answer's, which do, are not written either."""
    q, k = torch.randn(4, HEADS, DIM), torch.randn(4, KV_HEADS, DIM)
    buffers = [torch.zeros(KV_HEADS, 8, DIM) for _ in range(4)]
    with pytest.raises(RuntimeError, match="answer 1: 3 rows after 6 cached do not fit its buffer of 8"):
        native_kernels.bound().attend_cached(q, k, k.clone(), buffers[:2], buffers[2:], [2, 6],
                                             [torch.arange(3, 4), torch.arange(7, 10)], [None, None], 0.125)
    assert not any(buffer.any() for buffer in buffers)


def test_the_lean_forward_on_the_engines_caches_attends_in_the_op_with_the_bits_of_per_answer_updates(monkeypatch):
    """transformers' DynamicCache (its layers append: the per-answer updates) against the engine's cache
    (reserved_cache: room to write in): a prompt, one-token forwards and a verify block, the same logits."""
    model = quantise_model(tiny_llama(seed=3, hidden=256, layers=2), "int8", native=True)  # head_dim 64
    use_rowwise_attention(model)
    lean = copy.copy(model)
    assert use_lean_forward(lean)
    calls = []
    original = LeanDecoder.attend_cached
    monkeypatch.setattr(LeanDecoder, "attend_cached", lambda self, *args: calls.append(1) or original(self, *args))
    ids = torch.randint(3, 98, (1, 40), generator=torch.Generator().manual_seed(4))
    found = {}
    with torch.inference_mode():
        for name, cache in (("appending", DynamicCache(config=model.config)), ("reserved", reserved_cache(model.config))):
            logits = [lean(ids[:, :30], cache=cache, use_cache=True).logits[0]]
            logits += [lean(ids[:, t : t + 1], cache=cache, use_cache=True).logits[0] for t in range(30, 34)]
            logits.append(lean(ids[:, 34:40], cache=cache, use_cache=True).logits[0])  # a verify block
            found[name] = (torch.cat(logits), len(calls))
    assert torch.equal(found["appending"][0], found["reserved"][0])
    assert found["appending"][1] == 0 and found["reserved"][1] == 2 * 5  # two layers, five forwards after the prompt
