"""What computed a target's tokens: which kernels, on which CPU path, which precision its prompts ran
in, on how many threads.

Greedy output itself depends on these (docs/precision.md: specdec's int4 kernels and torch's give
different answers to most prompts), so every result names them, and a calibration profile measured
on other kernels is not used as if it were this run's (profile.kernels_mismatch).
"""

from __future__ import annotations

import torch

from . import native_kernels
from .gguf_blocks import format_counts
from .lean_forward import LeanLlama
from .quantize import Q8Linear


def computed_by(model) -> dict:
    """``{"kernels": "specdec-avx2" | "torch-avx512" | …, "prefill": "bfloat16" | …, "forward": "lean" |
    "transformers", "threads": N}``, and for a target prepared from a GGUF ``"formats"``: how many of
    its linears run in each format (gguf_blocks.format_counts: the file's own, or int4/int8 where
    specdec re-quantised them), since a tensor's format changes its answers too."""
    found = {"kernels": kernels(model), "prefill": prefill(model), "forward": forward(model),
             "threads": torch.get_num_threads()}
    formats = format_counts(model)
    return found | {"formats": formats} if formats else found


def forward(model) -> str:
    """Which forward ran the target: specdec's lean one (runtime/lean_forward.py: Llama, Mistral, Qwen 2
    and 3, Phi-3, Gemma 2 and 3 on its kernels; LeanGemma is a LeanLlama) or transformers' own, with
    specdec's linears inside where it quantised them. A result says which, since the lean one is the
    fast path and only some architectures take it."""
    return "lean" if isinstance(getattr(model.forward, "__self__", None), LeanLlama) else "transformers"


def kernels(model) -> str:
    """specdec's library and its CPU path where any linear runs on it, else torch's and the CPU
    capability torch dispatches to (``ATEN_CPU_CAPABILITY`` changes it, and its results)."""
    if any(isinstance(module, Q8Linear) for module in model.modules()):
        return f"specdec-{native_kernels.cpu_path()}"
    return f"torch-{torch.backends.cpu.get_cpu_capability().lower()}"


def prefill(model) -> str:
    """The dtype a prompt's forward multiplies in: the lean forward's dense copies (dense_prefill.py),
    else the same weights and kernels as decoding ("as decoding")."""
    lean = getattr(model.forward, "__self__", None)
    if isinstance(lean, LeanLlama) and lean.prompt_dtype is not None:
        return str(lean.prompt_dtype).removeprefix("torch.")
    return "as decoding"

