"""A quantised target as it is once prepared — packed int4 / int8 weights and scales, fused
projections, dense prompt copies, embeddings and norms — saved in one file and mapped back into
memory on later runs instead of rebuilt.

Preparing the project's int4 target re-reads the GGUF (its 49k-token vocabulary fields alone take
seconds), matches and packs every block and copies the float weights for prompts: most of a warm
start. Restoring builds the model's skeleton on the meta device (no weights allocated), puts the
saved modules in place and hands it tensors that torch maps from the file: nothing is
computed, so the restored model is the prepared one bit for bit (tested), and pages are read when
a forward first touches them.

The file is torch's own (``torch.save``, mapped by ``torch.load(mmap=True)``), because torch aligns
every tensor in it to 64 bytes: on AVX-512 the int8 kernel reads its weight (and its input) with
aligned 16-byte loads and faults on anything less, and safetensors packs tensors back to back at
whatever offset the ones before leave. ``read`` checks the alignment too, so a file that does not
give it is rebuilt, never handed to a kernel.

The file's metadata holds the key it was written under (the caller's source fingerprint, dtype and
``code_digest``) and the layout (which module is which kernel, which siblings share a projection,
which tensors are tied; beside it, which format each GGUF tensor runs in, gguf_blocks.format_counts);
a file that does not parse, has another key, or lacks a tensor the layout names raises ``Unusable``,
and the caller rebuilds it. So does one whose tensors do not match the
digest written with them (sampled_digest.py: the layout, every tensor's name, dtype and shape, and
1 KiB of every mebibyte of their bytes): hashing all ~0.6 GB would cost more than the restore it guards,
and any damaged run of a mebibyte or more is caught.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import zipfile
from pathlib import Path

import torch
from torch import nn

from ..errors import first_line
from . import staging
from .block_embedding import BlockEmbedding
from .fused_projections import SIBLINGS, SharedProjection, install
from .quantize import Int4Linear, Int8Linear, Q8Linear, int8_columns
from .sampled_digest import tensor_digest

FORMAT = "4"  # 4: the saved tensors carry their sampled digest
DENSE = "dense"  # tensor name prefix of the prompt copies: dense.LAYER.INDEX
SUFFIX = ".pt"
ALIGNMENT = 64  # bytes: what torch.save gives every tensor, more than any CPU kernel here asks


class Unusable(ValueError):
    """A prepared file that must not be used: unreadable, written under another key, or incomplete."""


def code_digest() -> str:
    """A digest of the code that prepares a target and of the libraries whose layouts it saves (the
    int4 pack differs by CPU capability): a file prepared under other code is stale."""
    from . import (block_embedding, dense_prefill, fused_projections, gguf_blocks, gguf_int4, gguf_linears,
                   native_kernels, quantize)

    digest = hashlib.sha256(FORMAT.encode())
    for module in (block_embedding, dense_prefill, fused_projections, gguf_blocks, gguf_int4, gguf_linears,
                   native_kernels, quantize):
        digest.update(Path(module.__file__).read_bytes())
    digest.update(Path(__file__).read_bytes())
    capability = torch.backends.cpu.get_cpu_capability()
    digest.update(f"{torch.__version__}|{capability}".encode())
    return digest.hexdigest()[:16]


def save(path: Path, model: nn.Module, dense: list[tuple[torch.Tensor, ...]] | None, key: str) -> None:
    """Write ``model`` (quantised by quantize.quantise_model) and its dense prompt copies to ``path``,
    atomically: a reader finds the whole file or none; OSError when it cannot be written."""
    tensors, layout = _flatten(model)
    for layer, weights in enumerate(dense or []):
        for index, weight in enumerate(weights):
            tensors[f"{DENSE}.{layer}.{index}"] = weight
    layout["dense"] = [len(weights) for weights in dense] if dense is not None else None
    tensors = {name: tensor.detach().contiguous() for name, tensor in tensors.items()}
    index = json.dumps(layout)
    saved = {"format": FORMAT, "key": key, "layout": index, "tensors": tensors, "digest": tensor_digest(tensors, index),
             "formats": json.dumps(getattr(model, "tensor_formats", {}))}
    with staging.staging(path.parent) as directory:
        try:
            torch.save(saved, directory / path.name)
        except RuntimeError as exc:  # a full disk, for one: torch's zip writer raises it
            raise OSError(f"{path}: {exc}") from None
        os.replace(directory / path.name, path)


def files(directory: Path, prefix: str) -> list[Path]:
    """The prepared files in ``directory`` whose names start with ``prefix``: this format's, and the
    safetensors files of the format before it (never read now; removed as stale files are)."""
    return [path for path in directory.glob(f"{prefix}*") if path.suffix in (SUFFIX, ".safetensors")]


def read(path: Path, key: str) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors saved at ``path`` (mapped, not copied) and their layout; ``Unusable`` if the file
    does not parse, was written under another key, or holds a tensor the kernels could not read."""
    try:
        saved = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
        if not isinstance(saved, dict) or saved.get("format") != FORMAT or saved.get("key") != key:
            raise Unusable(f"{path} was prepared under another key")
        tensors, layout = saved["tensors"], json.loads(saved["layout"])
        if "formats" in saved:  # which format each GGUF tensor runs in (layerwise.py); save always writes it
            layout["formats"] = json.loads(saved["formats"])
    except Unusable:
        raise
    except (OSError, EOFError, KeyError, ValueError, TypeError, RuntimeError, AttributeError, pickle.UnpicklingError,
            zipfile.BadZipFile) as exc:
        raise Unusable(f"{path}: {first_line(exc)}") from None
    misaligned = [name for name, tensor in tensors.items() if tensor.data_ptr() % ALIGNMENT]
    if misaligned:
        raise Unusable(f"{path}: {misaligned[0]} is not aligned to {ALIGNMENT} bytes")
    if saved.get("digest") != tensor_digest(tensors, saved["layout"]):
        raise Unusable(f"{path}: its tensors do not match the digest saved with them (the file is damaged)")
    return tensors, layout


def assemble(skeleton: nn.Module, tensors: dict[str, torch.Tensor], layout: dict) -> nn.Module:
    """``skeleton`` with ``read``'s tensors in place; ``Unusable`` when they do not fit it. Two
    skeletons assembled from the same tensors share them."""
    try:
        return _assemble(skeleton, tensors, layout)
    except Unusable:
        raise
    except (KeyError, ValueError, TypeError, RuntimeError, AttributeError) as exc:
        raise Unusable(f"the prepared tensors do not fit the model: {exc}") from None


def dense_copies(tensors: dict[str, torch.Tensor], layout: dict) -> list[tuple[torch.Tensor, ...]] | None:
    """The dense prompt copies among ``read``'s tensors, per layer, or None when none were saved."""
    try:
        return _dense(tensors, layout.get("dense"))
    except KeyError as exc:
        raise Unusable(f"a prompt copy is missing: {exc}") from None


def _flatten(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict]:
    """Every tensor of ``model`` once by name, and the layout that puts them back."""
    layout: dict = {"int4": {}, "int8": {}, "q8": {}, "embeddings": [], "shared": [], "parameters": [], "buffers": [],
                    "aliases": {}}
    for name, module in model.named_modules():
        if isinstance(module, BlockEmbedding):
            layout["embeddings"].append(name)
        elif isinstance(module, Q8Linear):
            layout["q8"][name] = [module.in_features, module.out_features, module.bits]
        elif isinstance(module, Int4Linear):
            layout["int4"][name] = [module.in_features, module.out_features, module.group]
        elif isinstance(module, Int8Linear):
            layout["int8"][name] = [module.in_features, module.out_features]
        for siblings, shared_name in SIBLINGS.items():
            if isinstance(getattr(module, shared_name, None), SharedProjection):
                widths = [getattr(module, s).out_features for s in siblings]
                layout["shared"].append([name, list(siblings), widths])
    tensors, seen = {}, {}
    for kind, named in (("parameters", model.named_parameters(remove_duplicate=False)),
                        ("buffers", model.named_buffers(remove_duplicate=False))):
        for name, tensor in named:
            if tensor is None:
                continue
            if id(tensor) in seen:  # tied (a tied lm_head's float weight is the embedding)
                layout["aliases"][name] = seen[id(tensor)]
                continue
            seen[id(tensor)] = name
            tensors[name] = tensor
            layout[kind].append(name)
    return tensors, layout


def _assemble(skeleton: nn.Module, tensors: dict[str, torch.Tensor], layout: dict) -> nn.Module:
    def linear(name: str) -> nn.Module:
        bias = tensors.get(f"{name}.bias")
        if name in layout["q8"]:
            in_features, out_features, bits = layout["q8"][name]
            return Q8Linear(tensors[f"{name}.codes"], tensors[f"{name}.scale"], tensors[f"{name}.offset"], bits,
                            in_features, out_features, bias)
        if name in layout["int4"]:
            in_features, out_features, group = layout["int4"][name]
            return Int4Linear.from_packed(tensors[f"{name}.packed"], tensors[f"{name}.scales_and_zeros"],
                                          in_features, out_features, bias, group)
        in_features, out_features = layout["int8"][name]
        q, scale = tensors[f"{name}.q"], tensors[f"{name}.scale"]
        if list(q.shape) != [out_features, int8_columns(in_features)]:
            raise Unusable(f"{name}: int8 weight of shape {list(q.shape)}")
        return Int8Linear.from_saved(q, scale, in_features, bias)

    fused = set()
    for parent_name, siblings, widths in layout["shared"]:
        parent = skeleton.get_submodule(parent_name) if parent_name else skeleton
        shared_name = SIBLINGS[tuple(siblings)]
        inner = f"{parent_name}.{shared_name}.linear" if parent_name else f"{shared_name}.linear"
        install(parent, tuple(siblings), linear(inner), widths)
        fused.add(inner)
    quantised = (set(layout["int4"]) | set(layout["int8"]) | set(layout["q8"])) - fused
    for name in quantised:
        parent_name, _, child = name.rpartition(".")
        setattr(skeleton.get_submodule(parent_name) if parent_name else skeleton, child, linear(name))
    for name in layout["embeddings"]:  # a GGUF's token embedding in its own blocks (block_embedding.py)
        parent_name, _, child = name.rpartition(".")
        setattr(skeleton.get_submodule(parent_name) if parent_name else skeleton, child, BlockEmbedding(
            tensors[f"{name}.codes"], tensors[f"{name}.scale"], tensors[f"{name}.offset"], tensors.get(f"{name}.embed_scale")))
    owned = {f"{name}.{attr}" for name in layout["embeddings"] for attr in ("codes", "scale", "offset", "embed_scale")}
    owned |= {f"{name}.{attr}" for name in layout["int4"] for attr in ("packed", "scales_and_zeros", "bias")}
    owned |= {f"{name}.{attr}" for name in layout["int8"] for attr in ("q", "scale", "bias")}
    owned |= {f"{name}.{attr}" for name in layout["q8"] for attr in ("codes", "scale", "offset", "bias")}
    for kind in ("parameters", "buffers"):
        for name in layout[kind]:
            if name in owned:
                continue
            module_name, _, attr = name.rpartition(".")
            module = skeleton.get_submodule(module_name) if module_name else skeleton
            if kind == "parameters":
                setattr(module, attr, nn.Parameter(tensors[name], requires_grad=False))
            else:
                module.register_buffer(attr, tensors[name], persistent=attr not in module._non_persistent_buffers_set)
    for name, target in layout["aliases"].items():
        module_name, _, attr = name.rpartition(".")
        module = skeleton.get_submodule(module_name) if module_name else skeleton
        source_name, _, source_attr = target.rpartition(".")
        setattr(module, attr, getattr(skeleton.get_submodule(source_name) if source_name else skeleton, source_attr))
    _check_materialised(skeleton)
    skeleton.tensor_formats = layout.get("formats", {})
    return skeleton


def _check_materialised(model: nn.Module) -> None:
    """No tensor left on the meta device: the layout covered the whole model."""
    for name, module in model.named_modules():
        held = list(module._parameters.items()) + list(module._buffers.items())
        held += [(k, v) for k, v in vars(module).items() if isinstance(v, torch.Tensor)]
        for attr, tensor in held:
            if tensor is not None and tensor.is_meta:
                raise Unusable(f"{name}.{attr} is not in the prepared file")


def _dense(tensors: dict[str, torch.Tensor], counts: list[int] | None) -> list[tuple[torch.Tensor, ...]] | None:
    if counts is None:
        return None
    return [tuple(tensors[f"{DENSE}.{layer}.{index}"] for index in range(count)) for layer, count in enumerate(counts)]
