"""The reserved KV cache: in-place updates with transformers' results bit for bit, through
one-token forwards, verify blocks, crops, a tree's gathered path and regrowth."""

import pytest
import torch
from conftest import tiny_llama
from transformers import DynamicCache

from specdec_cli.decoding.kv import crop_cache, keep_positions, reserved_cache
from specdec_cli.runtime import reserved_cache as reserved
from specdec_cli.runtime.reserved_cache import ReservedLayer
from specdec_cli.runtime.quantize import quantise_model
from specdec_cli.runtime.rowwise_attention import use_rowwise_attention


def script(model, cache) -> list[torch.Tensor]:
    """Every logit of a run that does what the engine does to a cache: a prompt, one-token
    forwards, blocks with their rejected tail cropped, and a tree-like gather of kept positions."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (1, 40), generator=generator)
    logits = [model(ids[:, :9], cache=cache, use_cache=True).logits]
    token = ids[:, 9:10]
    for step in range(24):
        length = cache.get_seq_length()
        if step % 6 == 5:  # a verify block of 4: two drafts kept
            out = model(torch.cat([token, ids[:, step : step + 3]], 1), cache=cache, use_cache=True)
            crop_cache(cache, length + 3)
        elif step % 6 == 2:  # a tree round: keep the root and the 2nd of 3 nodes
            out = model(torch.cat([token, ids[:, step : step + 2]], 1), cache=cache, use_cache=True)
            keep_positions(cache, torch.cat([torch.arange(length + 1), torch.tensor([length + 2])]))
        else:
            out = model(token, cache=cache, use_cache=True)
        logits.append(out.logits)
        token = out.logits[:, -1:].argmax(-1)
    return logits


@pytest.mark.parametrize("kind", ["float32", "int4"])
def test_a_reserved_cache_gives_transformers_logits_bit_for_bit(kind, monkeypatch):
    monkeypatch.setattr(reserved, "RESERVE_STEP", 4)  # regrow often
    model = tiny_llama(seed=5, hidden=64, layers=2)
    if kind != "float32":
        model = quantise_model(model, kind)
        use_rowwise_attention(model)
    with torch.inference_mode():
        expected = script(model, DynamicCache(config=model.config))
        cache = reserved_cache(model.config)
        got = script(model, cache)
    assert all(isinstance(layer, ReservedLayer) for layer in cache.layers)
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))


def test_an_update_writes_in_place_until_the_room_runs_out():
    layer = ReservedLayer()
    states = torch.arange(2 * 3 * 4, dtype=torch.float).view(1, 2, 3, 4)
    keys, _ = layer.update(states, -states)
    buffer = keys.data_ptr()
    room = layer.buffers[0].shape[-2]
    assert room >= reserved.RESERVE_STEP
    for _ in range((room - 3) // 3):
        keys, values = layer.update(states + 1, -states - 1)
        assert keys.data_ptr() == buffer  # transformers' layer concatenates into a new tensor each time
    assert torch.equal(keys[..., 3:6, :], states + 1) and torch.equal(values[..., :3, :], -states)
    keys, _ = layer.update(states, -states)  # past the room: a bigger buffer, the same contents
    assert keys.data_ptr() != buffer and keys.shape[-2] == 3 * ((room - 3) // 3 + 2)
    assert torch.equal(keys[..., :3, :], states) and torch.equal(keys[..., -3:, :], states)


def test_a_gathered_layer_seeds_a_new_buffer():
    cache = reserved_cache(tiny_llama(seed=5, layers=1).config)
    states = torch.arange(1 * 2 * 5 * 4, dtype=torch.float).view(1, 2, 5, 4)
    cache.update(states, states, 0)
    keep_positions(cache, torch.tensor([0, 2, 4]))
    keys, _ = cache.update(states[..., :1, :] + 100, states[..., :1, :], 0)
    assert torch.equal(keys, torch.cat([states[..., [0, 2, 4], :], states[..., :1, :] + 100], dim=-2))
    assert cache.layers[0].on_buffers and keys.data_ptr() == cache.layers[0].buffers[0].data_ptr()
