"""eagle3.map_head's two readings of vLLM's h: a drafted position (fed the layer's own output as h,
llm_base_proposer.propose) reads what specdec's head reads there only in the "feature" space,
where fc's feature half sits in q/k/v rather than in vLLM's fc."""

import pytest
import torch

from specdec_cli.decoding.head_network import DraftHead
from specdec_cli.export.eagle3 import Stats, eagle3_config, map_head, rms, vocab_maps

H, VOCAB, SCALE = 32, 50, 3.0
LAYER = {"vocab_size": VOCAB, "hidden_size": H, "num_hidden_layers": 1, "intermediate_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-12, "max_position_embeddings": 64,
         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}


def spec_head() -> tuple[DraftHead, dict]:
    """A head whose fc is a scaled rotation of the feature (no embedding part, no bias): every norm
    ratio the map uses is then exact, so what differs is where the map puts fc's feature half."""
    torch.manual_seed(0)
    head = DraftHead(LAYER, (2, -1)).eval()
    rotation, _ = torch.linalg.qr(torch.randn(H, H))
    with torch.no_grad():
        head.fc.weight.copy_(torch.cat([torch.zeros(H, H), SCALE * rotation], dim=1))
        head.fc.bias.zero_()
        head.layer.input_layernorm.weight.copy_(torch.rand(H) + 0.5)
    return head, {k: v.detach().clone() for k, v in head.state_dict().items()}


def mapped(state: dict, space: str):
    config = eagle3_config(LAYER, {"vocab_size": VOCAB, "hidden_size": H}, [2, 2], VOCAB, attention_bias=True)
    d2t, t2d = vocab_maps(None, VOCAB)
    stats = Stats(last_rms=1.0, embed_over_x=1.0, hidden_over_x=1.0, inverse_x=1.0, feature_over_x=1 / SCALE)
    return map_head(state, (2, -1), config, torch.ones(H), torch.randn(VOCAB, H), d2t, t2d, stats, space)


def specdec_q(head: DraftHead, embed: torch.Tensor, feature: torch.Tensor) -> torch.Tensor:
    """specdec's query input at a position reading ``feature`` (a drafted one: its previous guess)."""
    x = head.fc(torch.cat([embed, feature], dim=-1))
    return head.layer.self_attn.q_proj(head.layer.input_layernorm(x))


def vllm_q(eagle, embed: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    layer = eagle.midlayer
    u = torch.cat([rms(embed, layer.input_layernorm, eagle.eps), rms(h, layer.hidden_norm, eagle.eps)], dim=-1)
    return layer.self_attn.q_proj(u)


@torch.no_grad()
@pytest.mark.parametrize("space, drafted_exact", [("feature", True), ("fc", False)])
def test_a_drafted_position_reads_what_specdec_reads_only_in_the_feature_space(space, drafted_exact):
    head, state = spec_head()
    eagle = mapped(state, space)
    embed, guess = torch.randn(4, H), torch.randn(4, H)
    assert torch.allclose(vllm_q(eagle, embed, guess), specdec_q(head, embed, guess), atol=1e-4) is drafted_exact


@torch.no_grad()
@pytest.mark.parametrize("space", ["feature", "fc"])
def test_confirmed_positions_read_what_specdec_reads_in_both_spaces(space):
    head, state = spec_head()
    eagle = mapped(state, space)
    embed, features = torch.randn(4, H), torch.randn(4, 2 * H)
    fused = head.fused(features)
    assert torch.allclose(vllm_q(eagle, embed, eagle.combine(features)), specdec_q(head, embed, fused), atol=1e-4)


def test_an_unknown_space_is_refused():
    _, state = spec_head()
    with pytest.raises(ValueError, match="space must be one of"):
        mapped(state, "residual")
