"""Runs specdec's weight-only kernels on memory laid out as a mapped file can lay it out, in a process
of its own: a kernel that reads past its weight, or a weight the kernel cannot read where it lies,
kills this process (test_kernel_memory.py reads the exit status).

    python kernel_memory_probe.py guard KIND OUT IN    # each kernel tensor ends at an inaccessible page
    python kernel_memory_probe.py touch                # the guard page itself: must die by SIGSEGV
    python kernel_memory_probe.py prepared KIND HIDDEN # a tiny target prepared, then mapped back and run
    python kernel_memory_probe.py native BITS OUT IN   # specdec's own matmul on guarded tensors
    python kernel_memory_probe.py attend ROWS KEYS DIM # specdec's own attention on guarded tensors
    python kernel_memory_probe.py batch CASE...        # several in one process: CASE is guard:KIND:OUT:IN,
                                                       # prepared:KIND:HIDDEN, native:BITS:OUT:IN or
                                                       # attend:ROWS:KEYS:DIM, each followed by "ok CASE"

Prints ``ok`` when everything ran.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import tempfile

import torch

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(None, use_errno=True)
_keep = []  # the mappings behind guarded tensors live as long as the process


def guarded(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` whose last byte is the last byte before a PROT_NONE page."""
    tensor = tensor.contiguous()
    size = tensor.numel() * tensor.element_size()
    pages = -(-size // PAGE) * PAGE
    region = mmap.mmap(-1, pages + PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    if _libc.mprotect(ctypes.c_void_p(base + pages), PAGE, 0) != 0:
        raise OSError(ctypes.get_errno(), "mprotect")
    _keep.append(region)
    placed = torch.frombuffer(region, dtype=tensor.dtype, count=tensor.numel(), offset=pages - size)
    return placed.view(tensor.shape).copy_(tensor)


def kernel_tensors(linear) -> list[str]:
    from specdec_cli.runtime.quantize import Int4Linear

    return ["packed", "scales_and_zeros"] if isinstance(linear, Int4Linear) else ["q", "scale"]


def guard(kind: str, out_features: int, in_features: int) -> None:
    """A linear built the project's way, each of its kernel tensors moved against a guard page, run
    through the lean forward's kernel and the module's forward at every block length up to 8 rows."""
    from specdec_cli.runtime.lean_weights import kernel
    from specdec_cli.runtime.quantize import quantised_weight

    weight = torch.randn(out_features, in_features, generator=torch.Generator().manual_seed(0))
    linear = quantised_weight(weight, kind)
    for name in kernel_tensors(linear):
        linear.register_buffer(name, guarded(getattr(linear, name)))
    reference = linear.dequantized()
    run = kernel(linear)
    for rows in range(1, 9):
        x = torch.randn(rows, in_features)
        lean, module = run(x), linear(x)
        assert lean.shape == (rows, out_features) and torch.equal(lean, module)
        expected = x.to(torch.bfloat16).float() @ reference.t()
        assert torch.allclose(lean, expected, rtol=0.02, atol=0.05 * expected.abs().max().item()), (lean - expected).abs().max()


def touch() -> None:
    """Reads the byte after a guarded tensor: the process must die here, or the guard guards nothing."""
    placed = guarded(torch.zeros(100, dtype=torch.int8))
    ctypes.string_at(placed.data_ptr() + placed.numel(), 1)


def prepared(kind: str, hidden: int) -> None:
    """A tiny target loaded twice at ``kind``: built and saved, then mapped back from its prepared
    file. Every mapped tensor must lie where the kernels can read it, and both must score alike."""
    from conftest import char_tokenizer, tiny_llama
    from prepared_support import forwards, spec

    from specdec_cli.pairs.cache_dir import cache_root
    from specdec_cli.pairs import loading
    from specdec_cli.runtime import prepared_file

    with tempfile.TemporaryDirectory(prefix="specdec-probe-") as root:
        os.environ["SPECDEC_CACHE"] = os.path.join(root, "cache")
        target = os.path.join(root, "target")
        tiny_llama(seed=4, hidden=hidden).save_pretrained(target)
        char_tokenizer().save_pretrained(target)
        built = loading.load(spec(target, kind)).model
        mapped = loading.load(spec(target, kind)).model
        for a, b in zip(forwards(built), forwards(mapped)):
            assert torch.equal(a, b)
        (path,) = prepared_file.files(cache_root(), "prepared-")
        tensors = dict(list(mapped.named_buffers()) + list(mapped.named_parameters()))
        misaligned = [n for n, t in tensors.items() if t.data_ptr() % prepared_file.ALIGNMENT]
        assert not misaligned, f"mapped from {path.name} at addresses no kernel is promised: {misaligned[:3]}"


def native(bits: int, out_features: int, in_features: int) -> None:
    """specdec's own matmul (runtime/native_kernels.py) with its codes, scales, offsets and input each
    against a guard page, at every block length up to 8 rows: the same bits as from the heap. Both
    storages: float32 scales and offsets, and float16 scales with the offset a multiple of them."""
    from specdec_cli.pairs.cache_dir import cache_root
    from specdec_cli.runtime import native_kernels

    native_kernels.load(cache_root())
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 2**bits, (out_features, in_features), generator=g)
    scale = torch.rand(out_features, in_features // 32, generator=g) * 0.02 + 0.001
    for offset in (-scale * torch.rand(scale.shape, generator=g), None):
        if offset is None:
            scale = scale.half().float()
            offset = -scale * 2 ** (bits - 1)
        packed = native_kernels.pack(codes, scale, offset, bits)
        placed = [guarded(t) for t in packed]
        for rows in range(1, 9):
            x = torch.randn(rows, in_features, generator=g)
            got = native_kernels.bound().matmul(guarded(x), *placed, bits)
            assert torch.equal(got, native_kernels.bound().matmul(x, *packed, bits))


def attend(rows: int, keys: int, dim: int) -> None:
    """specdec's attention op with queries, keys, values, counts and index each against a guard page,
    causal and through an index: the same bits as from the heap."""
    from specdec_cli.pairs.cache_dir import cache_root
    from specdec_cli.runtime import native_kernels

    native_kernels.load(cache_root())
    g = torch.Generator().manual_seed(0)
    q, key, value = (torch.randn(*shape, generator=g) for shape in ((rows, 4, dim), (2, keys, dim), (2, keys, dim)))
    counts = torch.arange(keys - rows + 1, keys + 1)
    index = torch.stack([torch.randperm(keys, generator=g) for _ in range(rows)])
    for chosen in (None, index):
        want = native_kernels.bound().attend_rows([q], [key], [value], [counts], [chosen], dim**-0.5)
        got = native_kernels.bound().attend_rows([guarded(q)], [guarded(key)], [guarded(value)], [guarded(counts)],
                                                 [None if chosen is None else guarded(chosen)], dim**-0.5)
        assert torch.equal(got, want)


PROBES = {"guard": lambda kind, out, inner: guard(kind, int(out), int(inner)), "touch": touch,
          "prepared": lambda kind, hidden: prepared(kind, int(hidden)),
          "native": lambda bits, out, inner: native(int(bits), int(out), int(inner)),
          "attend": lambda rows, keys, dim: attend(int(rows), int(keys), int(dim))}


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "batch":  # one import of torch for all: the first case that fails ends the process
        for case in args:
            name, *values = case.split(":")
            PROBES[name](*values)
            print("ok", case, flush=True)
    elif command in PROBES:
        PROBES[command](*args)
    else:
        raise SystemExit(f"unknown probe {command}")
    print("ok")
