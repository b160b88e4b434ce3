"""A prepared Llama target without transformers: the module tree its prepared file is mapped into,
for a command that only decodes.

Importing transformers' modeling code (``modeling_utils``, the model registry, the masking
functions, and through them torch.distributed, torch._dynamo and scipy) takes longer than loading
the whole prepared target, and importing the package alone takes longer than mapping it (it scans
every model's files); a command that only decodes never runs any of it, because the lean forward
(lean_forward.py) is all the engine calls. So the skeleton here has transformers' module
names (``model.layers.N.self_attn``, ``lm_head``, ...) and nothing else: prepared_file.assemble fills it
as it fills transformers' own skeleton, and the lean forward reads the same kernels and norms from
it. The rotary module computes what transformers' default rope computes, op for op (tested bit
for bit). A call the lean forward does not handle is refused here, not handed to a transformers
model built on demand: that build imports the modeling code mid-decode (a second or more), and a
command that may need transformers' model loads it at the start (pairs/loading.py, ``lean=False``).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from .block_embedding import embedding_device, embedding_dtype


class LeanConfig(SimpleNamespace):
    """A model's (or a draft head's layer's) configuration as attributes, as transformers' generic
    configuration holds a config.json's fields, without importing transformers: its package import
    alone costs more than mapping the prepared target. Its type also says "loaded without
    transformers" where that matters: such a model's cache is specdec's own (decoding/kv.py)."""

    def get_text_config(self, decoder=None, encoder=None) -> "LeanConfig":
        return self


def lean_config(directory: str | Path) -> LeanConfig | None:
    """The directory's config.json, or None when the lean skeleton cannot stand for the model: not a
    Llama, or a rope that is not the default one."""
    path = Path(directory) / "config.json"
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    rope = values.get("rope_parameters") or {}
    if values.get("model_type") != "llama" or rope.get("rope_type") != "default" or values.get("rope_scaling"):
        return None
    return LeanConfig(**({"use_cache": True} | values))  # LlamaConfig's own default, where the file has none


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


class Rotary(nn.Module):
    """transformers' default rope (LlamaRotaryEmbedding.forward), on the saved ``inv_freq``."""

    def __init__(self):
        super().__init__()
        self.attention_scaling = 1.0  # the default rope's: cos and sin unscaled
        self.register_buffer("inv_freq", torch.empty(0, device="meta"), persistent=False)
        self.register_buffer("original_inv_freq", torch.empty(0, device="meta"), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


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


class LeanCausalLM(nn.Module):
    """transformers' LlamaForCausalLM module tree, empty (prepared_file.assemble fills it), with the
    attributes the decoding engine reads."""

    def __init__(self, config, generation_config):
        super().__init__()
        self.config, self.generation_config = config, generation_config
        eps = config.rms_norm_eps
        layers = [_container(self_attn=nn.Module(), mlp=nn.Module(), input_layernorm=Norm(eps),
                             post_attention_layernorm=Norm(eps)) for _ in range(config.num_hidden_layers)]
        # A drafter looks tokens up in it; a weight given is not initialised (see uninitialised_linear).
        embed = nn.Embedding(config.vocab_size, config.hidden_size,
                             _weight=torch.empty(config.vocab_size, config.hidden_size, device="meta"))
        self.model = _container(embed_tokens=embed, layers=nn.ModuleList(layers), norm=Norm(eps),
                                rotary_emb=Rotary())
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
