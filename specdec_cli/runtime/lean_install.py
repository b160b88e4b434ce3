"""The lean forward installed on a model: the class that runs its architecture (lean_forward.py for
Llama's layer and its kin, lean_gemma.py for Gemma's, a subclass), chosen once at load."""

from __future__ import annotations

import torch

from .lean_architectures import LLAMA_LAYERS
from .lean_forward import LeanLlama
from .lean_gemma import LeanGemma, LeanGemma2
from .lean_weights import supported


def use_lean_forward(model, dense: list[tuple[torch.Tensor, ...]] | None = None) -> bool:
    """Install the lean forward on ``model`` when it is supported, with dense weights for
    prompts where given (dense_prefill.py); True when it was installed."""
    if not supported(model):
        return False
    if model.config.model_type in LLAMA_LAYERS:
        lean = LeanLlama
    else:
        lean = LeanGemma2 if model.config.model_type == "gemma2" else LeanGemma
    model.forward = lean(model, dense).forward
    return True
