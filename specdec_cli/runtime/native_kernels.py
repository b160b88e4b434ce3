"""specdec's own kernel library (C++ in native/, its ops in ``torch.ops.specdec``), for a quantised
target's linears and attention.

Its weight-only matmul (native/q8_matmul.cpp; "q8" names its int8 activation codes, as in
``quantize.Q8Linear``) multiplies int4 or int8 weight codes with int8 activation codes by integer dot
products. torch's int4/int8 kernels unpack the weights again for every 4 rows, so a 5-row verify
block costs almost twice a one-token call; this one reads a tile of weights once for all rows, and
each row's result is bit-identical to that row computed alone (its integer sums are exact, its float
steps the same few in the same order). The arithmetic differs from torch's kernels (activations are
rounded to 8 bits per block of 32, not to bfloat16), so a target on it is a new target:
docs/precision.md says by how much.

The same library holds the attention op a target on these kernels attends with
(native/attention_rows.cpp, rowwise_attention.py). It is compiled once per torch version and source,
with the machine's C++ compiler, into specdec's cache (``install.sh`` runs this module to do it
ahead; the first load does it otherwise, and waits for the compile). Where it cannot be built or the
CPU lacks AVX2, ``load`` says why, ``available`` tells the user once, and the target runs on torch's
kernels instead. It runs AVX-512 VNNI where torch's own CPU capability is AVX-512, else AVX2
(``ATEN_CPU_CAPABILITY=avx2`` gives the AVX2 path here); the matmul gives the same bits on both.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from ..notices import log
from . import kernel_checksum, staging

SOURCE_DIR = Path(__file__).with_name("native")  # library.cpp (the ops), q8_matmul.cpp, attention_rows.cpp and its two bodies, cpu_features.h
BLOCK = 32  # inputs per scale, activations and weights alike
TILE = 16  # outputs per weight tile
FLAGS = ["-O3", "-std=c++20", "-fPIC", "-shared", "-fopenmp", "-ffp-contract=off", "-Wall"]
COMPILE_SECONDS = 600  # a compile takes ~10-30 s here; past this something is wrong, and torch's kernels run
DIRECTORY_VAR = "SPECDEC_KERNELS"


class Unavailable(RuntimeError):
    """The kernel cannot run here; the message says why."""


def sources() -> list[Path]:
    """The files the library is built from (a change to any makes another library)."""
    return sorted(p for p in SOURCE_DIR.glob("*") if p.suffix in (".cpp", ".inc", ".h"))


def library_path(cache: Path) -> Path:
    """Where the library for this source, torch version and flags is kept: ``$SPECDEC_KERNELS``, else
    ``kernels/`` under the specdec cache ``cache``."""
    digest = hashlib.sha256()
    for source in sources():
        digest.update(source.read_bytes())
    digest.update(f"{torch.__version__}|{' '.join(FLAGS)}".encode())
    directory = Path(os.environ[DIRECTORY_VAR]) if os.environ.get(DIRECTORY_VAR) else cache / "kernels"
    return directory / f"specdec_kernels-{digest.hexdigest()[:16]}.so"


def build(path: Path) -> str:
    """Compile the library into ``path`` (atomically); what the compiler said (its warnings, empty on a
    clean build: the record keeps it), else ``Unavailable`` with the compiler's last words."""
    compiler, quirks = find_compiler()
    try:
        with staging.staging(path.parent) as scratch:  # removed by a later run if this one is killed
            output = scratch / path.name
            try:
                done = subprocess.run(command(compiler, quirks, str(output)), capture_output=True, text=True,
                                      timeout=COMPILE_SECONDS)
            except subprocess.TimeoutExpired:
                raise Unavailable(f"compiling specdec's kernels ({compiler}) took more than {COMPILE_SECONDS} s") from None
            except OSError as exc:  # the compiler itself, not the cache
                raise Unavailable(f"compiling specdec's kernels failed ({compiler}): {exc.strerror or exc}") from None
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                raise Unavailable(f"compiling specdec's kernels failed ({compiler}): {last}")
            os.replace(output, path)
    except OSError as exc:  # a read-only cache, or another user's
        raise Unavailable(f"cannot write {exc.filename or path.parent} ({exc.strerror or exc}): set SPECDEC_CACHE "
                          "to a directory you can write") from None
    return done.stderr


def command(compiler: str, quirks: list[str], output: str) -> list[str]:
    """The compile line: torch's headers as system headers and its C++ ABI, as torch.utils.cpp_extension
    gives them (importing cpp_extension itself costs more than a start may spend)."""
    root = Path(torch.__file__).parent
    includes = [root / "include", root / "include/torch/csrc/api/include"]
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    units = [str(p) for p in sources() if p.suffix == ".cpp"]
    return [compiler, *FLAGS, *quirks, abi, *(f"-isystem{p}" for p in includes), *units,
            f"-L{root / 'lib'}", "-lc10", "-ltorch_cpu", "-o", output]


def find_compiler() -> tuple[str, list[str]]:
    """``$CXX``, else g++, else c++, and the flags its version needs; ``Unavailable`` for none, or for
    one that is not GCC-compatible (the sources use GCC's target attributes and pragmas)."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not compiler:
        raise Unavailable("no C++ compiler found (apt-get install g++, or set CXX)")
    try:
        done = subprocess.run([compiler, "-dM", "-E", "-x", "c++", os.devnull], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"the C++ compiler {compiler} does not run: {exc}") from None
    macros = dict(line.split(" ", 2)[1:] for line in done.stdout.splitlines() if line.startswith("#define ") and line.count(" ") >= 2)
    if done.returncode != 0 or "__GNUC__" not in macros:
        raise Unavailable(f"{compiler} is not a GCC-compatible C++ compiler (the kernels use GCC's target attributes): "
                          "set CXX to g++ or clang++")
    if "__clang__" not in macros and macros["__GNUC__"].strip() in ("10", "11", "12"):
        # GCC 12's intrinsics headers warn about their own self-initialised "undefined" vectors
        # once inlined (GCC bug 105593, fixed in 13); our code has no other such warning.
        return compiler, ["-Wno-uninitialized", "-Wno-maybe-uninitialized"]
    return compiler, []


@cache
def cpu_path() -> str:
    """"avx512" or "avx2", as torch's own kernels choose (``ATEN_CPU_CAPABILITY``), or "" without AVX2."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability in ("AVX512", "AMX") and torch.cpu._is_vnni_supported():
        return "avx512"
    return "avx2" if capability in ("AVX2", "AVX512", "AMX") else ""


def load(cache: Path) -> str:
    """Load the library from the specdec cache ``cache`` (building it there first when missing, or
    again when it is not what was built: dlopen on a truncated file dies of SIGBUS) and return its
    CPU path; ``Unavailable`` when it cannot run here."""
    if os.environ.get("SPECDEC_TORCH_KERNELS"):
        raise Unavailable("SPECDEC_TORCH_KERNELS is set")
    if loaded():
        return cpu_path()
    path_name = cpu_path()
    if not path_name:
        raise Unavailable(f"the CPU path {torch.backends.cpu.get_cpu_capability()} has no AVX2")
    path = library_path(cache)
    if not path.exists() or not kernel_checksum.record_path(path).exists():  # never built, or before records
        compiled(path, None)
    elif damage := kernel_checksum.damage(path):
        compiled(path, damage)
    try:
        torch.ops.load_library(str(path))
    except (OSError, RuntimeError) as exc:
        raise Unavailable(f"{path} does not load: {exc}") from None
    return path_name


def compiled(path: Path, damage: str | None) -> None:
    """Build the library at ``path``, then its checksum record. A ``damage``d library (kernel_checksum)
    is built again with one warning; where it cannot be, ``Unavailable`` carries both reasons, so
    the user reads one line either way."""
    log.info(f"compiling specdec's int8 matmul kernel {'again' if damage else 'once'} (~20 s)")
    try:
        kernel_checksum.write(path, build(path))
    except (Unavailable, OSError) as exc:  # OSError: a cache that cannot be written
        if damage:
            raise Unavailable(f"{path} is damaged ({damage}) and cannot be compiled again: {exc}") from None
        raise Unavailable(str(exc)) from None
    if damage:
        log.warning(f"specdec's kernel library {path} was damaged ({damage}): compiled it again")


_told: list[str] = []


def available(cache: Path) -> bool:
    """Whether a quantised target runs on this library, decided when a target is loaded: ``load``
    from the specdec cache ``cache``; where it cannot run, the user is told why once a process, and
    torch's int4/int8 kernels run."""
    try:
        load(cache)
    except Unavailable as exc:
        if not _told:
            _told.append(str(exc))
            log.warning(f"specdec's int8 matmul kernel is not available ({exc}): the target runs on torch's "
                        "int4/int8 kernels, whose verify blocks cost more")
        return False
    return True


def loaded() -> bool:
    return hasattr(torch.ops.specdec, "q8_matmul")


def fits(in_features: int) -> bool:
    return in_features % BLOCK == 0


def pack(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bits: int) -> tuple[torch.Tensor, ...]:
    """Weights ``w = scale * code + offset`` per block of 32 inputs (codes [N, K] in 0..2^bits − 1,
    scale and offset [N, K / 32]) in the kernel's layout: codes [N/16, K/32, 256 | 512] uint8, scale
    and offset [N/16, K/32, 16] as ``compact`` stores them; N is padded to 16 with zero weights.
    ``bits`` 6: a scale and an offset per 16 inputs (a GGUF Q6_K tensor's; scale and offset [N, K / 16]),
    codes a byte each as at 8 bits, scale and offset [N/16, K/32, 2, 16]."""
    missing = -codes.shape[0] % TILE
    if missing:
        codes, scale, offset = (torch.cat([t, t.new_zeros(missing, t.shape[1])]) for t in (codes, scale, offset))
    rows, columns = codes.shape
    tiles, blocks = rows // TILE, columns // BLOCK
    quads = codes.to(torch.uint8).view(tiles, TILE, blocks, 8, 4).permute(0, 2, 3, 1, 4).reshape(tiles, blocks, 8, 64)
    if bits == 4:
        quads = quads[:, :, 0::2] | (quads[:, :, 1::2] << 4)
    halves = HALVES.get(bits, 1)
    per_tile = lambda t: t.float().view(tiles, TILE, blocks, halves).permute(0, 2, 3, 1).reshape(  # noqa: E731
        tiles, blocks, *((halves,) if halves > 1 else ()), TILE).contiguous()
    return quads.reshape(tiles, blocks, -1).contiguous(), *compact(per_tile(scale), per_tile(offset))


HALVES = {6: 2}  # bits -> scales per block of 32 inputs, where not one
# Offsets that are a fixed multiple of their scale: −centre · d for Q4_0 (8), Q5_0 (16), Q6_K (32), Q8_0 and int8 (128).
MULTIPLES = (-8.0, -16.0, -32.0, -128.0)


def compact(scale: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``scale`` and ``offset`` (float32) in the fewest bytes that hold them exactly, so that a weight
    reads no more than its file's block: float16 where every value is one (a GGUF block's d and m are),
    and an offset that is a fixed multiple of its scale as that one multiple (a float32 [1]: the kernel
    multiplies it out, exactly, since it is a power of two)."""
    multiple = next((m for m in MULTIPLES if torch.equal(offset, scale * m)), None)
    if torch.equal(scale.half().float(), scale) and (multiple is not None or torch.equal(offset.half().float(), offset)):
        scale, offset = scale.half(), offset.half()
    return scale, offset if multiple is None else torch.tensor([multiple])


def widened(scale: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``compact``'s storage back to float32 scales and offsets of one shape: what pieces packed apart
    (each compacted alone) are joined as, before the whole is compacted once."""
    scale = scale.float()
    return scale, scale * offset if offset.numel() == 1 else offset.float()


def unpack(codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bits: int) -> torch.Tensor:
    """``pack``'s layout back to float32 weights [N padded to 16, K]: ``scale * code + offset``."""
    tiles, blocks = codes.shape[:2]
    quads = codes.view(tiles, blocks, -1, 64)
    if bits == 4:
        quads = torch.stack([quads & 0x0F, quads >> 4], dim=3).view(tiles, blocks, 8, 64)
    halves = HALVES.get(bits, 1)
    values = quads.view(tiles, blocks, 8, TILE, 4).permute(0, 3, 1, 2, 4).reshape(tiles, TILE, blocks, halves, -1).float()
    scale, offset = widened(scale, offset)
    # [tiles, 16, blocks, halves, 1]
    per_output = lambda t: t.view(tiles, blocks, halves, TILE).permute(0, 3, 1, 2)[..., None]  # noqa: E731
    return (values * per_output(scale) + per_output(offset)).reshape(tiles * TILE, blocks * BLOCK)


def op(name: str = "q8_matmul"):
    """A loaded op itself (``q8_matmul``, ``attend_rows`` or ``attend_cached``); a model on these kernels exists only
    once ``load`` succeeded."""
    if not loaded():
        raise Unavailable("specdec's kernels are not loaded (native_kernels.load)")
    return getattr(torch.ops.specdec, name)


def avx512() -> bool:
    """The ops' CPU-path argument: AVX-512 VNNI, else AVX2 (the same bits either way for the matmul)."""
    return cpu_path() == "avx512"


@dataclass(frozen=True)
class Kernels:
    """The two ops and their CPU-path argument, looked up once where a model on them is built
    (``bound``): a lookup by name is not free, and a token calls them over a hundred times."""

    q8_matmul: object
    attend_rows_op: object
    attend_cached_op: object
    avx512: bool

    def matmul(self, x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
               bits: int) -> torch.Tensor:
        """x [rows, K] float32 → [rows, N padded to 16] float32."""
        return self.q8_matmul(x.contiguous(), codes, scale, offset, bits, self.avx512)

    def attend_rows(self, queries, keys, values, counts, indices, scaling) -> torch.Tensor:
        """Per answer [rows, heads, dim] queries against its [kv heads, keys, dim] → every answer's
        [rows, heads, dim] one after another, in one call (rowwise_attention.py)."""
        return self.attend_rows_op(queries, keys, values, counts, indices, scaling, self.avx512)

    def attend_cached(self, queries, keys, values, key_buffers, value_buffers, cached, counts, indices, scaling) -> torch.Tensor:
        """``attend_rows`` for answers whose caches have room: every answer's new [rows, kv heads, dim] keys
        and values (one after another, as its queries) written into its [kv heads, room, dim] buffers
        after its ``cached`` positions, then each answer's rows against its buffers' positions so far."""
        return self.attend_cached_op(queries, keys, values, key_buffers, value_buffers, cached, counts, indices, scaling,
                                     self.avx512)


@cache
def bound() -> Kernels:
    """The loaded library's ops, bound once a process (``Unavailable`` before ``load``: not kept)."""
    return Kernels(op("q8_matmul"), op("attend_rows"), op("attend_cached"), avx512())


if __name__ == "__main__":  # install.sh: python3 -m specdec_cli.runtime.native_kernels CACHE
    try:
        cpu = load(Path(sys.argv[1]))
        print(f"specdec's int8 matmul kernel ready ({cpu}) at {library_path(Path(sys.argv[1]))}", file=sys.stderr)
    except Unavailable as exc:
        print(f"specdec's int8 matmul kernel is not available ({exc}): torch's kernels will run", file=sys.stderr)
