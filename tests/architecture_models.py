"""Tiny random-weight GGUF files of each architecture transformers loads from GGUF and specdec's lean
forward runs (Llama, Mistral, Qwen 2 and 3, Phi-3, Gemma 2, Gemma 3's text model), written with the
``gguf`` package and a cut of SmolLM2's tokenizer: the whole CLI on each in seconds, no download.

Each is what llama.cpp's converter writes for the architecture, at 64 wide: its linears random Q4_0
blocks, its embedding and (untied) output Q8_0, its norms and Qwen 2's biases random float32.
transformers maps a GGUF's sliding window for Gemma only (Phi-3's stays none), and the layer kinds
not at all: Gemma 2 alternates sliding and global layers, Gemma 3 has five sliding layers to a global
one, hence its six layers.

Mistral is the file llama.cpp's converter writes for a ``MistralForCausalLM`` (conversion/llama.py
registers it with Llama's converter): ``general.architecture`` "llama", with a Mistral config's shape
(four query heads to a key-value head, as Mistral 7B's 32 to 8; rope theta 1e6 and norm epsilon 1e-5,
as v0.2 and v0.3; an FFN 3.5 times the width; an untied output). What that covers, and what not:
- transformers reads it as a Llama (``LlamaForCausalLM``), as it reads the Mistral GGUFs users have:
  the lean forward's Llama path at 4:1 grouped-query attention and Mistral's rope, on the file's own
  Q4_0 blocks with q and k rows in llama.cpp's order (transformers un-permutes them per key-value head).
- not transformers' ``MistralForCausalLM`` on a GGUF: a file named "mistral" it cannot map (gguf-py
  has no such architecture, only llama.cpp's "mistral3" and "mistral4", which transformers does not
  read; transformers 5.25, gguf 0.19). Mistral's own class runs in tests/test_lean_architectures.py,
  from a transformers config.
- not Mistral v0.1's 4,096-token sliding window: llama.cpp's converter writes no window for a Llama
  (nor does llama.cpp apply one to it), so no such file has it. The window's rows run in
  tests/test_lean_architectures.py ("mistral", a 16-token window).
- not Mistral's SentencePiece vocabulary: every file here has the same byte-level BPE (below).

The tokenizer is SmolLM2's first ``VOCAB`` tokens and the merges among them: a byte-level BPE like the
whole (the specials, every byte, then merges in rank order), whose metadata gguf's reader parses in a
fraction of the time. The whole 49,152 tokens and 48,900 merges took most of a tiny model's first run
(the reader reads each string alone, and a first run reads the file's metadata four times).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specdec_cli.atomic import updating, write_atomically

BIG_GGUF = Path(__file__).resolve().parent.parent / "benchmarks" / "make_big_gguf.py"
WINDOW = 64  # Gemma's sliding window: a prompt plus answer past it reaches the window's edge
HIDDEN, HEADS, KV_HEADS, FFN = 64, 4, 2, 128
VOCAB = 2048  # SmolLM2's first tokens: its specials, its 256 bytes, then merged tokens (the module's docstring)
# A random model without these repeats a token or two (its state is the context's average, or the token
# itself): an embedding twice the output's, an output of its own where the architecture has one, and
# attention scores 16 times as wide (a few positions weigh, not all alike) give an answer of many
# tokens that depends on which positions the window keeps.
EMBEDDING, OUTPUT = 0.1, 0.05
# 32 tokens whose output rows are three times the others': nearly all of an answer's tokens are among
# them (14 to 22 distinct in 40; Gemma 2, whose output is its embedding, has no such rows), so that it
# repeats itself and prompt lookup drafts past the window (and now and then is right).
FAVOURED, FAVOUR = slice(1000, 1032), 3.0
SHARPER = {"attn_q": 4.0, "attn_k": 4.0, "attn_qkv": 4.0, "attn_q_norm": 4.0, "attn_k_norm": 4.0}


@dataclass(frozen=True)
class Architecture:
    """How llama.cpp writes one architecture: its GGUF name, a layer's tensors beyond Llama's, and more."""

    gguf_arch: str
    layers: int = 2
    extra: tuple[str, ...] = ()  # a layer's tensors besides Llama's (shapes())
    head_dim: int = 16  # Qwen 3's is its config's default, 128: transformers reads no head size from its GGUF
    window: bool = False  # attention.sliding_window and attention.key_length written (Gemma's keys)
    tied: bool = False  # no output.weight: llama.cpp has none for Gemma 2
    kv_heads: int = KV_HEADS
    ffn: int = FFN
    rope_base: float = 10000.0
    eps: float = 1e-6


ARCHITECTURES = {
    "llama": Architecture("llama"),
    # a MistralForCausalLM as llama.cpp converts it (the module's docstring): Mistral 7B v0.2/v0.3's
    # 4:1 heads, rope theta and epsilon, and its FFN's 3.5 times the width
    "mistral": Architecture("llama", kv_heads=1, ffn=224, rope_base=1e6, eps=1e-5),
    "qwen2": Architecture("qwen2", extra=("attn_q.bias", "attn_k.bias", "attn_v.bias")),
    "qwen3": Architecture("qwen3", extra=("attn_q_norm", "attn_k_norm"), head_dim=128),
    "phi3": Architecture("phi3"),
    "gemma2": Architecture("gemma2", extra=("post_attention_norm", "post_ffw_norm"), window=True, tied=True),
    "gemma3": Architecture("gemma3", layers=6, window=True,
                           extra=("attn_q_norm", "attn_k_norm", "post_attention_norm", "post_ffw_norm")),
}


def big_gguf():
    """benchmarks/make_big_gguf.py, whose Q4_0 and Q8_0 blocks and tokenizer copy these files share."""
    spec = importlib.util.spec_from_file_location("make_big_gguf", BIG_GGUF)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def shapes(arch: str) -> dict[str, tuple[int, ...]]:
    """A layer's tensor shapes [rows, columns] (a vector's [length]) by llama.cpp's role name."""
    spec = ARCHITECTURES[arch]
    head_dim, ffn = spec.head_dim, spec.ffn
    q, kv = HEADS * head_dim, spec.kv_heads * head_dim
    found = {"attn_norm": (HIDDEN,), "ffn_norm": (HIDDEN,), "attn_q": (q, HIDDEN), "attn_k": (kv, HIDDEN),
             "attn_v": (kv, HIDDEN), "attn_output": (HIDDEN, q), "ffn_gate": (ffn, HIDDEN), "ffn_up": (ffn, HIDDEN),
             "ffn_down": (HIDDEN, ffn)}
    if arch == "phi3":  # q, k and v in one tensor, gate and up in another
        for role in ("attn_q", "attn_k", "attn_v", "ffn_gate"):
            del found[role]
        found["attn_qkv"], found["ffn_up"] = (q + 2 * kv, HIDDEN), (2 * ffn, HIDDEN)
    extra = {"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,), "attn_q_norm": (head_dim,),
             "attn_k_norm": (head_dim,), "post_attention_norm": (HIDDEN,), "post_ffw_norm": (HIDDEN,)}
    found.update({role: extra[role] for role in ARCHITECTURES[arch].extra})
    return found


def scaled(blocks: np.ndarray, size: int, factor: float) -> np.ndarray:
    """Q4_0 or Q8_0 ``blocks`` (of ``size`` bytes, a float16 scale first) with their scales times ``factor``."""
    shaped = blocks.reshape(blocks.shape[0], -1, size)
    scales = shaped[..., :2].copy().view(np.float16)
    shaped[..., :2] = (scales.astype(np.float32) * factor).astype(np.float16).view(np.uint8)
    return blocks


def q8_0_blocks(make, rng: np.random.Generator, rows: int, largest: float) -> np.ndarray:
    """make_big_gguf's random Q8_0 blocks [rows, HIDDEN] with values of about ±``largest``."""
    blocks = make.q8_0_blocks(rng, rows, HIDDEN)
    shaped = blocks.reshape(rows, -1, 34)
    shaped[..., :2] = np.full(shaped.shape[:2], largest / 127, np.float16)[..., None].view(np.uint8)
    return blocks


def tensors(arch: str, vocab: int, rng: np.random.Generator, make,
            tied: bool = False) -> list[tuple[str, np.ndarray, object]]:
    """(name, data, quantisation type) in the file's order; a quantised tensor's data is its bytes."""
    import gguf

    q4, q8, f32 = gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
    found = [("token_embd.weight", q8_0_blocks(make, rng, vocab, EMBEDDING), q8)]
    for layer in range(ARCHITECTURES[arch].layers):
        for role, shape in shapes(arch).items():
            name = f"blk.{layer}.{role}" + ("" if role.endswith(".bias") else ".weight")
            if len(shape) == 2:
                found.append((name, scaled(make.q4_0_blocks(rng, *shape), 18, SHARPER.get(role, 1.0)), q4))
            else:  # norms near one, biases near zero: neither their initial value
                base = 0.0 if role.endswith(".bias") else SHARPER.get(role, 1.0)
                found.append((name, (base + 0.2 * rng.standard_normal(shape)).astype(np.float32), f32))
    found.append(("output_norm.weight", (1.0 + 0.2 * rng.standard_normal(HIDDEN)).astype(np.float32), f32))
    if not (tied or ARCHITECTURES[arch].tied):
        output = q8_0_blocks(make, rng, vocab, OUTPUT)
        scaled(output[FAVOURED], 34, FAVOUR)
        found.append(("output.weight", output, q8))
    return found


@functools.cache
def tokenizer_fields() -> tuple[tuple[str, object, object, object], ...]:
    """(key, value, type, sub-type) of SmolLM2's tokenizer fields, cut to its first VOCAB tokens and the
    merges among them (both halves and their join kept): read once a process, the source's reader being slow."""
    import gguf

    fields = gguf.GGUFReader(big_gguf().tokenizer_source()).fields
    tokens = fields["tokenizer.ggml.tokens"].contents()[:VOCAB]
    kept = set(tokens)
    merges = [merge for merge in fields["tokenizer.ggml.merges"].contents()
              if all(part in kept for part in (*merge.split(" "), merge.replace(" ", "")))]
    cut = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.merges": merges,
           "tokenizer.ggml.token_type": fields["tokenizer.ggml.token_type"].contents()[:VOCAB]}
    return tuple((key, cut.get(key, field.contents()), field.types[0], field.types[1] if len(field.types) > 1 else None)
                 for key, field in fields.items() if key.startswith("tokenizer."))


def add_tokenizer(writer) -> int:
    """The cut of SmolLM2's tokenizer (tokenizer_fields) into ``writer``; its vocabulary size."""
    for key, value, kind, sub_type in tokenizer_fields():
        writer.add_key_value(key, value, kind, sub_type=sub_type)
    writer.add_vocab_size(VOCAB)
    return VOCAB


def write_gguf(path: Path, arch: str, seed: int = 0, tied: bool = False) -> Path:
    """A tiny random ``arch`` model as a GGUF file at ``path``, with the cut of SmolLM2's tokenizer;
    ``tied``: no output.weight, the embedding serving as the output too (as in SmolLM2's file)."""
    import gguf

    make, spec = big_gguf(), ARCHITECTURES[arch]
    writer = gguf.GGUFWriter(path, spec.gguf_arch)
    writer.add_name(f"tiny {arch}")
    writer.add_block_count(spec.layers)
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(spec.ffn)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(spec.kv_heads)
    writer.add_rope_freq_base(spec.rope_base)
    writer.add_layer_norm_rms_eps(spec.eps)
    writer.add_rope_dimension_count(spec.head_dim)
    if spec.window:
        writer.add_key_length(spec.head_dim)
        writer.add_value_length(spec.head_dim)
        writer.add_sliding_window(WINDOW)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    vocab = add_tokenizer(writer)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for name, data, kind in tensors(arch, vocab, np.random.default_rng(seed), make, tied):
        writer.add_tensor(name, data, raw_dtype=None if kind == gguf.GGMLQuantizationType.F32 else kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def kept_gguf(directory: Path, arch: str) -> Path:
    """``arch``'s GGUF in ``directory``, the tests' cache: its conversion and prepared target are made
    once, not per run. Written again, under a lock, when the code that writes it has changed: the same
    path, so that specdec removes the earlier copy's conversion and prepared target."""
    path = directory / f"tiny-{arch}.gguf"
    digest = hashlib.sha256(Path(__file__).read_bytes() + BIG_GGUF.read_bytes()).hexdigest()
    written = path.with_suffix(".sha256")  # what wrote the file: recorded after it
    with updating(path):
        if not (path.is_file() and written.is_file() and written.read_text() == digest):
            with tempfile.TemporaryDirectory(dir=directory) as scratch:
                os.replace(write_gguf(Path(scratch) / path.name, arch), path)
            write_atomically(written, digest)
    return path
