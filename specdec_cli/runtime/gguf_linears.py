"""A model's linears at the precision its GGUF holds (``--dtype gguf``): each tensor's own blocks
(gguf_blocks.py) on specdec's kernel as a quantize.Q8Linear; float tensors (F32, F16, BF16) stay
float32 linears.

Sibling projections (q/k/v, gate/up) are stacked into one kernel as quantize.quantise_model does:
their codes are unpacked bytes until packed, so a 4-bit sibling beside an 8-bit one is stacked as
8-bit codes, and any sibling beside a Q6_K one at the kernel's ``bits`` 6, its scale and offset
repeated for both halves of each block (the same weights: more bytes for its rows). A group with a
float member is not stacked.
"""

from __future__ import annotations

import torch
from torch import nn

from . import native_kernels
from .fused_projections import install, sibling_groups
from .gguf_blocks import FileBlocks
from .quantize import Q8Linear

NO_KERNELS = ("--dtype gguf runs each GGUF tensor on specdec's kernels, which are not available here (see the warning "
              "above): choose --dtype int4 or int8")


def not_gguf(source) -> str:
    """The one line refusing ``--dtype gguf`` for a target that is not a GGUF file."""
    return (f"--dtype gguf runs a GGUF file's own tensors, and {source} is not a .gguf file: give a GGUF target "
            "or another dtype")


def file_linear(blocks: FileBlocks, bias: torch.Tensor | None = None) -> Q8Linear:
    """A GGUF tensor's blocks as the kernel's linear."""
    rows, columns = blocks.codes.shape
    packed = native_kernels.pack(blocks.codes, blocks.scale, blocks.offset, blocks.bits)
    return Q8Linear(*packed, blocks.bits, columns, rows, bias)


def stacked(members: list[FileBlocks]) -> FileBlocks:
    """Sibling tensors' blocks one above the other (rows in order), at the bits that hold them all:
    4 where all are 4-bit, 6 where any is (a scale per 16 inputs), else 8."""
    kinds = {member.bits for member in members}
    bits = 6 if 6 in kinds else max(kinds)
    groups = max(member.scale.shape[1] for member in members)
    spread = lambda t: t.repeat_interleave(groups // t.shape[1], dim=1)  # noqa: E731  the same scale for each half
    return FileBlocks("+".join(dict.fromkeys(member.kind for member in members)),
                      torch.cat([member.codes for member in members]),
                      torch.cat([spread(member.scale) for member in members]),
                      torch.cat([spread(member.offset) for member in members]), bits)


def quantise_file_precision(model: nn.Module, blocks: dict[str, FileBlocks]) -> nn.Module:
    """Every nn.Linear that has blocks (module name -> FileBlocks) on the kernel as the file holds it,
    in place; siblings stacked where all have blocks. Linears without blocks stay as they are (float32).
    The lm_head keeps its float weight as ``float_weight``, as quantize.quantise_model leaves it."""
    for parent_name, siblings in sibling_groups(model):
        names = [f"{parent_name}.{s}" if parent_name else s for s in siblings]
        if not all(name in blocks for name in names):
            continue
        parent = model.get_submodule(parent_name) if parent_name else model
        widths = [getattr(parent, s).out_features for s in siblings]
        install(parent, siblings, file_linear(stacked([blocks[name] for name in names])), widths)
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for name, module in [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and n in blocks]:
        replacement = file_linear(blocks[name], module.bias)
        if module is output:
            replacement.float_weight = module.weight
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, replacement)
    return model
