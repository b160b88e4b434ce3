"""A prepared target without transformers: the module tree its prepared file is mapped into, for a
command that only decodes (Llama and the architectures of its layer, Gemma 2 and 3).

Importing transformers' modeling code (``modeling_utils``, the model registry, the masking
functions, and through them torch.distributed, torch._dynamo and scipy) takes longer than loading
the whole prepared target, and importing the package alone takes longer than mapping it (it scans
every model's files); a command that only decodes never runs any of it, because the lean forward
(lean_forward.py) is all the engine calls. So the skeleton here has transformers' module
names (``model.layers.N.self_attn``, ``lm_head``, ...) and nothing else: prepared_file.assemble fills it
as it fills transformers' own skeleton, and the lean forward reads the same kernels and norms from
it. The rotary modules compute what transformers' compute from the frequencies the prepared file
holds, op for op (tested bit for bit), for the ropes whose cos and sin are unscaled. A call the lean
forward does not handle is refused here, not handed to a transformers model built on demand: that
build imports the modeling code mid-decode (a second or more), and a command that may need
transformers' model loads it at the start (pairs/loading.py, ``lean=False``).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from .block_embedding import embedding_device, embedding_dtype
from .lean_architectures import LLAMA_LAYERS


class LeanConfig(SimpleNamespace):
    """A model's (or a draft head's layer's) configuration as attributes, as transformers' generic
    configuration holds a config.json's fields, without importing transformers: its package import
    alone costs more than mapping the prepared target. Its type also says "loaded without
    transformers" where that matters: such a model's cache is specdec's own (decoding/kv.py)."""

    def get_text_config(self, decoder=None, encoder=None) -> "LeanConfig":
        return self


GEMMA_TYPES = ("gemma3_text", "gemma2")
SKELETON_TYPES = LLAMA_LAYERS | set(GEMMA_TYPES)
# Ropes whose frequencies the prepared file holds and whose cos and sin are unscaled (an attention
# factor of 1), so that the rotary modules below compute transformers' from the file alone.
UNSCALED_ROPES = {"default", "linear", "llama3"}
LAYER_KINDS = {"sliding_attention", "full_attention"}  # the kinds the lean layers attend as (lean_weights.layer_kinds)
LLAMA_NORMS = ("input_layernorm", "post_attention_layernorm")
# Gemma norms each block's input and its output
GEMMA_NORMS = (*LLAMA_NORMS, "pre_feedforward_layernorm", "post_feedforward_layernorm")


def lean_config(directory: str | Path) -> LeanConfig | None:
    """The directory's config.json, or None when the lean skeleton cannot stand for the model: another
    architecture, or a configuration the file does not state whole (``stated``)."""
    path = Path(directory) / "config.json"
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if values.get("model_type") not in SKELETON_TYPES or not stated(values):
        return None
    return LeanConfig(**({"use_cache": True} | values))  # LlamaConfig's own default, where the file has none


def stated(values: dict) -> bool:
    """config.json in transformers 5's form, which states its ropes (``rope_parameters``) and Gemma's
    layer kinds (an older one leaves them to the configuration class, which only transformers knows),
    each rope an unscaled one and each layer's kind, where given, one the lean layers know. Gemma 3 has
    a rope per kind of layer, the others one for all."""
    rope, kinds = values.get("rope_parameters"), values.get("layer_types")
    if not isinstance(rope, dict) or values.get("rope_scaling"):
        return False
    kinds_stated = (isinstance(kinds, list) and len(kinds) == values.get("num_hidden_layers")
                    and all(isinstance(kind, str) and kind in LAYER_KINDS for kind in kinds))
    if not kinds_stated and (kinds is not None or values["model_type"] in GEMMA_TYPES):
        return False
    ropes = [rope.get(kind) for kind in set(kinds)] if values["model_type"] == "gemma3_text" else [rope]
    return all(isinstance(r, dict) and r.get("rope_type") in UNSCALED_ROPES for r in ropes)


GENERATION_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def lean_generation_config(directory: str | Path, config: LeanConfig) -> LeanConfig:
    """generation_config.json, else the token ids transformers' GenerationConfig takes from the
    model's config; the engine reads its eos_token_id."""
    try:
        values = json.loads((Path(directory) / "generation_config.json").read_text())
    except OSError:
        values = {name: getattr(config, name, None) for name in GENERATION_IDS}
    return LeanConfig(**values)


class Norm(nn.Module):
    """An RMSNorm's weight and epsilon, which is all the lean forward reads of one."""

    def __init__(self, eps: float):
        super().__init__()
        self.variance_epsilon = eps


def rotary_cos_sin(x: torch.Tensor, position_ids: torch.Tensor, inv_freq: torch.Tensor,
                   scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """What transformers' rotary modules compute from their frequencies, op for op."""
    freqs = position_ids[..., None].float() * inv_freq.to(device=x.device, dtype=torch.float)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * scaling
    sin = emb.sin() * scaling
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


class Rotary(nn.Module):
    """transformers' rotary module of Llama's kin and Gemma 2 (LlamaRotaryEmbedding.forward) for an
    unscaled rope, on the saved ``inv_freq``."""

    def __init__(self):
        super().__init__()
        self.attention_scaling = 1.0  # the default rope's: cos and sin unscaled
        self.register_buffer("inv_freq", torch.empty(0, device="meta"), persistent=False)
        self.register_buffer("original_inv_freq", torch.empty(0, device="meta"), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rotary_cos_sin(x, position_ids, self.inv_freq, self.attention_scaling)


class GemmaNorm(nn.Module):
    """A Gemma RMSNorm's weight and epsilon (lean_gemma.norm_of reads them)."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps


class KindRotary(nn.Module):
    """transformers' Gemma 3 rotary module (Gemma3RotaryEmbedding.forward): per kind of layer its own
    saved frequencies, cos and sin unscaled."""

    def __init__(self, kinds: list[str]):
        super().__init__()
        self.attention_scaling = 1.0
        for kind in dict.fromkeys(kinds):
            self.register_buffer(f"{kind}_inv_freq", torch.empty(0, device="meta"), persistent=False)
            self.register_buffer(f"{kind}_original_inv_freq", torch.empty(0, device="meta"), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str):
        return rotary_cos_sin(x, position_ids, getattr(self, f"{layer_type}_inv_freq"), self.attention_scaling)


def uninitialised_linear(width_in: int, width_out: int, bias: bool = False) -> nn.Linear:
    """An nn.Linear whose parameters are empty meta tensors, for weights assigned later: initialising
    one, even on the meta device (as torch's ``skip_init`` does), goes through torch._refs, which
    imports torch._dynamo (over a second)."""
    module = nn.Linear.__new__(nn.Linear)
    nn.Module.__init__(module)
    module.in_features, module.out_features = width_in, width_out
    module.weight = nn.Parameter(torch.empty(width_out, width_in, device="meta"))
    module.register_parameter("bias", nn.Parameter(torch.empty(width_out, device="meta")) if bias else None)
    return module


def _container(**children: nn.Module) -> nn.Module:
    module = nn.Module()
    for name, child in children.items():
        setattr(module, name, child)
    return module


def _decoder_layer(config) -> nn.Module:
    """One decoder layer's modules that are not linears (prepared_file.assemble puts those in)."""
    eps, gemma = config.rms_norm_eps, config.model_type in GEMMA_TYPES
    norm = GemmaNorm if gemma else Norm
    attention = nn.Module()
    if config.model_type in ("qwen3", "gemma3_text"):  # q and k normed per head (lean_weights.qkv_kernel)
        attention = _container(q_norm=norm(eps), k_norm=norm(eps))
        attention.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    norms = GEMMA_NORMS if gemma else LLAMA_NORMS
    return _container(self_attn=attention, mlp=nn.Module(), **{name: norm(eps) for name in norms})


class LeanCausalLM(nn.Module):
    """transformers' module tree of a model of ``SKELETON_TYPES`` (LlamaForCausalLM's, Qwen3's with
    q/k norms, Gemma's with their four norms a layer), empty (prepared_file.assemble fills it; Phi-3's
    fused projections and Qwen 2's biases come with the linears), with the attributes the decoding
    engine reads."""

    def __init__(self, config, generation_config):
        super().__init__()
        self.config, self.generation_config = config, generation_config
        eps, gemma = config.rms_norm_eps, config.model_type in GEMMA_TYPES
        layers = [_decoder_layer(config) for _ in range(config.num_hidden_layers)]
        # A drafter looks tokens up in it; a weight given is not initialised (see uninitialised_linear).
        # Gemma's embed_scale buffer comes with the prepared tensors.
        embed = nn.Embedding(config.vocab_size, config.hidden_size,
                             _weight=torch.empty(config.vocab_size, config.hidden_size, device="meta"))
        rotary = KindRotary(config.layer_types) if config.model_type == "gemma3_text" else Rotary()
        self.model = _container(embed_tokens=embed, layers=nn.ModuleList(layers),
                                norm=GemmaNorm(eps) if gemma else Norm(eps), rotary_emb=rotary)
        self.lm_head = nn.Module()

    @property
    def dtype(self) -> torch.dtype:
        return embedding_dtype(self.model.embed_tokens)

    @property
    def device(self) -> torch.device:
        return embedding_device(self.model.embed_tokens)

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(self, *args, **kwargs):
        """Reached only for what the lean forward (lean_forward.py) does not run: refused."""
        given = ", ".join(sorted(kwargs)) or "no options"
        raise RuntimeError(f"the lean forward does not run this call ({given}), and this target was loaded for it alone; "
                           "load it with lean=False (pairs/loading.py) for transformers' model")
