"""Sibling linears that read the same input (q/k/v, gate/up) as one weight-only matmul.

A one-token forward of a small quantised target is dominated by per-call overhead, not by the
weights: each linear costs a kernel call and two casts. Concatenating the siblings' weights along
the output dimension makes one call of each; every sibling is replaced by a slice of the shared
output, so the model's own attention and MLP code runs unchanged. The kernels compute every
output column on its own, so each slice holds exactly what the sibling computed alone (tested).
"""

from __future__ import annotations

import torch
from torch import nn

SIBLINGS = {("q_proj", "k_proj", "v_proj"): "qkv_proj", ("gate_proj", "up_proj"): "gate_up_proj"}  # -> the shared one


class SharedProjection(nn.Module):
    """One linear computed once per input for the slices that read it; its output is kept until
    every slice has read it, and an input that is not the one kept is computed afresh."""

    def __init__(self, linear: nn.Module, readers: int):
        super().__init__()
        self.linear, self.readers = linear, readers
        self._input: torch.Tensor | None = None
        self._output: torch.Tensor | None = None
        self._read: set[int] = set()

    def read(self, x: torch.Tensor, reader: int) -> torch.Tensor:
        if x is not self._input or reader in self._read:
            self._input, self._output, self._read = x, self.linear(x), set()
        output = self._output
        self._read.add(reader)
        if len(self._read) == self.readers:  # all slices served: let go of the tensors
            self._input = self._output = None
        return output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class ProjectionSlice(nn.Module):
    """What one sibling linear gave: columns ``start:stop`` of the shared projection."""

    def __init__(self, shared: SharedProjection, reader: int, start: int, stop: int):
        super().__init__()
        self.__dict__["shared"] = shared  # not a submodule: the parent holds it once
        self.reader, self.start, self.stop = reader, start, stop
        self.in_features, self.out_features = shared.linear.in_features, stop - start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shared.read(x, self.reader)[..., self.start : self.stop]

    def extra_repr(self) -> str:
        return f"columns {self.start}:{self.stop} of the shared projection"


def sibling_groups(model: nn.Module) -> list[tuple[str, tuple[str, ...]]]:
    """(parent module name, sibling names) for every parent holding a whole group of nn.Linear
    siblings with the same input width and no bias."""
    groups = []
    for name, module in model.named_modules():
        for siblings in SIBLINGS:
            linears = [getattr(module, s, None) for s in siblings]
            if all(isinstance(m, nn.Linear) and m.bias is None for m in linears) and \
                    len({m.in_features for m in linears}) == 1:
                groups.append((name, siblings))
    return groups


def install(parent: nn.Module, siblings: tuple[str, ...], fused: nn.Module, widths: list[int]) -> None:
    """Put ``fused`` (the siblings' weights stacked in order) in place of the siblings."""
    shared = SharedProjection(fused, len(siblings))
    setattr(parent, SIBLINGS[siblings], shared)
    start = 0
    for reader, (sibling, width) in enumerate(zip(siblings, widths)):
        setattr(parent, sibling, ProjectionSlice(shared, reader, start, start + width))
        start += width
