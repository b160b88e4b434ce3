"""Which models the lean forward (lean_forward.py) runs, judged from a configuration alone: the load
names an architecture that runs transformers' forward instead, and `specdec models` says which
pairs run lean before any is loaded. No torch here: `specdec models` answers without it."""

from __future__ import annotations

# Llama's decoder layer, give or take q/k/v biases, q/k norms, a window, q/k/v and gate/up fused in the checkpoint (Phi-3)
LLAMA_LAYERS = {"llama", "mistral", "qwen2", "qwen3", "phi3"}
LEAN_TYPES = LLAMA_LAYERS | {"gemma3_text", "gemma2"}
# Ropes whose cos and sin are a function of the position alone: "dynamic" and "longrope" change the
# frequencies with the longest position in a forward, so a block's rows would not score as one-token
# forwards do (in transformers' forward too).
STATIC_ROPES = {"default", "linear", "llama3", "yarn"}
# A GGUF's general.architecture -> the model_type transformers converts it to.
GGUF_TYPES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
              "gemma2": "gemma2", "gemma3": "gemma3_text"}


def ropes(config) -> list[dict]:
    """Every kind of layer's rope parameters (Gemma 3 gives one per layer type)."""
    found = getattr(config, "rope_parameters", None) or {"rope_type": "default"}
    return list(found.values()) if all(isinstance(r, dict) for r in found.values()) else [found]


def whole_static_rope(config) -> bool:
    """Every kind of layer's rope is one of STATIC_ROPES and turns the whole head (a partial rotary
    factor leaves some of it as it is: not the lean layers' rotation)."""
    found = ropes(config)
    partial = [r.get("partial_rotary_factor", 1.0) for r in found] + [getattr(config, "partial_rotary_factor", None) or 1.0]
    return all(r.get("rope_type", "default") in STATIC_ROPES for r in found) and all(f == 1.0 for f in partial)


def refusal(config) -> str | None:
    """Why the lean forward does not run a model of ``config`` (attributes as transformers' config
    has them), or None where its architecture and rope are ones it runs."""
    model_type = getattr(config, "model_type", None)
    if model_type not in LEAN_TYPES:
        return f"the lean forward does not cover {model_type!r} models (it runs {', '.join(sorted(LEAN_TYPES))})"
    if not whole_static_rope(config):
        kinds = sorted({r.get("rope_type", "default") for r in ropes(config)} - STATIC_ROPES)
        rotated = f"its {', '.join(kinds)} rope changes with a forward's longest position" if kinds else \
            "its rope turns only part of each head"
        return f"{rotated}, so a verify block's rows would not score as one-token forwards"
    return None
