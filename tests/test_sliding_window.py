"""Models whose layers slide an attention window (Mistral; Gemma 2 and 3 mixing sliding and full
layers): past the window, every mode gives plain decoding's tokens, and plain decoding gives
transformers' own. A rejected draft past the window must be rolled back (specdec's cache keeps every
position), and a tree's mask must hide what the window hides."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM

from specdec_cli.decoding.acceptance import SamplingParams
from specdec_cli.decoding.drafters.head import HeadDrafter, HeadTree
from specdec_cli.decoding.drafters.lookup import NgramDrafter
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.head_network import DraftHead, head_config
from specdec_cli.decoding.tree import Tree, attention_mask, tree_masks

WINDOW = 16
PROMPT = [2] + [5, 6, 7, 8] * 6  # repeats, so that lookup drafts; 25 tokens, past the window already
NEW = 60


def tiny(kind: str):
    torch.manual_seed(0)
    shape = dict(vocab_size=98, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, max_position_embeddings=512, sliding_window=WINDOW)
    if kind == "gemma3":  # sliding and full layers, as Gemma 3 alternates them
        return Gemma3ForCausalLM(Gemma3TextConfig(**shape, layer_types=["sliding_attention", "full_attention"] * 2)).eval()
    if kind == "gemma2":
        return Gemma2ForCausalLM(Gemma2Config(**shape)).eval()
    return MistralForCausalLM(MistralConfig(**shape)).eval()  # every layer slides


def tokens(model, drafter, k, sampling=SamplingParams(), seed=0) -> list[int]:
    engine = SpeculativeEngine(model, drafter, set())
    return [t for e in engine.generate(PROMPT, k=k, max_new_tokens=NEW, sampling=sampling, seed=seed) for t in e.emitted]


@pytest.mark.parametrize("kind", ["gemma3", "gemma2", "mistral"])
def test_every_mode_past_the_window_gives_plain_decodings_tokens(kind):
    model = tiny(kind)
    plain = tokens(model, None, 0)
    reference = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                               pad_token_id=0)[0, len(PROMPT):].tolist()
    assert plain == reference
    assert tokens(model, NgramDrafter(), 3) == plain
    head = HeadDrafter(DraftHead(head_config(model)), model)
    assert tokens(model, HeadTree(head), 6) == plain
    sampled = SamplingParams(1.0)
    assert tokens(model, NgramDrafter(), 3, sampled, seed=7) == tokens(model, None, 0, sampled, seed=7)


def test_a_tree_mask_hides_what_the_window_hides():
    tree = Tree(torch.tensor([1, 2, 3]), (-1, 0, 0))  # the root, two children at depth 1
    cached = 5
    seen = attention_mask(tree, cached, window=4)[0, 0]
    # The root sits at position 5: it sees positions 2-4 and itself, not 0-1.
    assert seen[0].tolist() == [False, False, True, True, True, True, False, False]
    # A child sits at position 6: positions 3-5 and its own; never its sibling.
    assert seen[1].tolist() == [False, False, False, True, True, True, True, False]
    assert torch.equal(attention_mask(tree, cached)[0, 0, :, :cached], torch.ones(3, cached, dtype=torch.bool))


def test_each_kind_of_layer_gets_its_own_tree_mask():
    tree = Tree(torch.tensor([1, 2]), (-1, 0))
    mixed = tree_masks(tiny("gemma3").config, tree, 40)
    assert set(mixed) == {"full_attention", "sliding_attention"}
    assert mixed["full_attention"][..., :40].all() and not mixed["sliding_attention"][..., :40].all()
    sliding = tree_masks(tiny("mistral").config, tree, 40)
    assert isinstance(sliding, torch.Tensor) and torch.equal(sliding, mixed["sliding_attention"])  # every layer slides
