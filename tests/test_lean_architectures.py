"""The lean forward beyond Llama (Gemma 3's text model, Gemma 2, Qwen 2 and 3, Mistral, Phi-3, Llama's other ropes):
transformers' logits and caches bit for bit, a verify block's rows exactly as one-token forwards
past a sliding window, trees and batched answers under per-kind masks, and the engine's tokens in
every mode those of transformers' greedy generate, past the window."""

import copy

import pytest
import torch
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from specdec_cli.decoding.drafters.lookup import NgramDrafter
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.kv import crop_cache, keep_positions, reserved_cache
from specdec_cli.decoding.tree import Tree, tree_masks, verify_tree
from specdec_cli.pairs.cache_dir import cache_root
from specdec_cli.runtime import native_kernels
from specdec_cli.runtime.computed_by import forward
from specdec_cli.runtime.lean_forward import Block, LeanLlama, fallback_forwards, forward_many
from specdec_cli.runtime.lean_install import use_lean_forward
from specdec_cli.runtime.lean_weights import supported
from specdec_cli.runtime.quantize import quantise_model
from specdec_cli.runtime.rowwise_attention import use_rowwise_attention

pytestmark = pytest.mark.cpu_kernels  # run again on AVX2's kernels (test_cpu_paths.py)

WINDOW = 16
SHAPE = dict(vocab_size=98, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=512, bos_token_id=0, eos_token_id=1,
             pad_token_id=None, tie_word_embeddings=False)
ARCHITECTURES = ["gemma3", "gemma3-softcap", "gemma2", "qwen2", "qwen3", "mistral", "phi3", "llama3-rope", "yarn-rope"]


def float_model(arch: str, seed: int = 0):
    torch.manual_seed(seed)
    if arch.startswith("gemma3"):
        config = Gemma3TextConfig(**SHAPE, sliding_window=WINDOW, query_pre_attn_scalar=12,
                                  layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
                                  final_logit_softcapping=3.0 if arch.endswith("softcap") else None)
        model = Gemma3ForCausalLM(config)
    elif arch.startswith("gemma2"):  # soft-capped attention logits (a cap that bites) and logits (30)
        cap = None if arch.endswith("uncapped") else 0.5
        model = Gemma2ForCausalLM(Gemma2Config(**SHAPE, sliding_window=WINDOW, query_pre_attn_scalar=12, attn_logit_softcapping=cap))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPE))
    elif arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**SHAPE))
    elif arch == "mistral":
        model = MistralForCausalLM(MistralConfig(**SHAPE, sliding_window=WINDOW))
    elif arch == "phi3":  # q/k/v and gate/up fused in the checkpoint, every layer sliding
        model = Phi3ForCausalLM(Phi3Config(**SHAPE, sliding_window=WINDOW))
    else:
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64, "rope_theta": 10000.0} if arch == "llama3-rope" else \
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 10000.0}
        model = LlamaForCausalLM(LlamaConfig(**SHAPE, rope_parameters=rope))
    with torch.no_grad():  # clear argmaxes, and norms (and biases) that are not their initial ones
        model.lm_head.weight.mul_(8.0)
        for name, parameter in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                parameter.add_(torch.randn_like(parameter) * 0.2)
    return model.eval()


def quantised(arch: str, kind: str):
    """(transformers' forward, the lean forward) over the same quantised weights."""
    native = kind == "native"
    if native:
        assert native_kernels.available(cache_root()), "specdec's kernels do not build here"
    model = quantise_model(float_model(arch), "int8" if native else kind, native=native)
    use_rowwise_attention(model)
    lean = copy.copy(model)  # shares every module; only its forward differs
    assert use_lean_forward(lean) and forward(lean) == "lean" and forward(model) == "transformers"
    return model, lean


def run(model, ids, cache, **kwargs):
    return model(ids, cache=cache, use_cache=True, **kwargs)


def caches_equal(a, b):
    return all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values) for x, y in zip(a.layers, b.layers))


@pytest.mark.parametrize("kind", ["int8", "int4", "native"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_lean_logits_caches_and_hidden_states_equal_transformers_bit_for_bit(arch, kind):
    model, lean = quantised(arch, kind)
    ids = torch.randint(3, 98, (1, 140), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        caches = reserved_cache(model.config), reserved_cache(model.config)
        # a long prompt past the window, tokens, blocks, then blocks past another window's worth, and
        # past the positions a prompt attends row by row on specdec's op (a block across them is no prompt)
        for start, stop in ((0, 70), (70, 71), (71, 72), (72, 77), (77, 78), (78, 90), (90, 91), (91, 100),
                            (100, 125), (125, 131), (131, 140)):
            outs = [run(m, ids[:, start:stop], c, logits_to_keep=1 if stop - start > 20 else 0, output_hidden_states=True)
                    for m, c in zip((model, lean), caches)]
            assert torch.equal(outs[0].logits, outs[1].logits), (start, stop)
            assert all(torch.equal(a, b) for a, b in zip(outs[0].hidden_states, outs[1].hidden_states))
            assert caches_equal(*caches)
        assert torch.equal(model(ids[:, :40]).logits, lean(ids[:, :40]).logits)  # no cache, every row
    assert fallback_forwards(lean) == 0


@pytest.mark.parametrize("kind", ["int8", "int4", "native"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_a_blocks_rows_past_the_window_score_exactly_as_one_token_forwards(arch, kind):
    _, lean = quantised(arch, kind)
    ids = torch.randint(3, 98, (1, 50), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        cache = reserved_cache(lean.config)
        run(lean, ids[:, :20], cache)  # past the window already
        one = torch.cat([run(lean, ids[:, i : i + 1], cache).logits[0] for i in range(20, 50)])
        for lengths in ((8, 1, 5, 16), (3, 27), (30,)):
            crop_cache(cache, 20)
            start, found = 20, []
            for length in lengths:
                found.append(run(lean, ids[:, start : start + length], cache).logits[0])
                start += length
            assert torch.equal(torch.cat(found), one), lengths


@pytest.mark.parametrize("kind", ["int8", "native"])
@pytest.mark.parametrize("arch", ["gemma3", "gemma2", "mistral", "qwen3"])
def test_a_tree_past_the_window_gives_transformers_logits_and_cache_and_batches_alike(arch, kind):
    model, lean = quantised(arch, kind)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 98, (1, 30), generator=g)
    tree = Tree(torch.tensor([5, 17, 23, 40, 41, 9]), (-1, 0, 0, 1, 2, 2))
    with torch.inference_mode():
        caches = [reserved_cache(model.config) for _ in range(3)]
        outs = []
        for m, cache in zip((model, lean), caches):
            run(m, ids, cache)
            outs.append(verify_tree(m, cache, tree, torch.device("cpu"), output_hidden_states=-1))
            keep_positions(cache, torch.tensor([*range(30), 30, 32, 35]))
        assert torch.equal(outs[0].logits, outs[1].logits)
        assert torch.equal(outs[0].hidden_states[-1], outs[1].hidden_states[-1])
        assert caches_equal(*caches[:2])
        follow = [run(m, torch.tensor([[7]]), c).logits for m, c in zip((model, lean), caches)]
        assert torch.equal(*follow)
        # the tree beside a chain in one forward of several: each as its own
        other = reserved_cache(model.config)
        run(lean, ids, caches[2])
        run(lean, ids[:, :25], other)
        mask = tree_masks(model.config, tree, 30, torch.bool)
        chain = torch.tensor([3, 4, 5])
        batched = forward_many(lean).forward_many([Block(tree.tokens, caches[2], 30 + tree.depths(), mask), Block(chain, other)])
        assert torch.equal(batched[0].logits, outs[1].logits)
        crop_cache(other, 25)
        assert torch.equal(batched[1].logits, run(lean, chain[None], other).logits)


@pytest.mark.parametrize("arch", ["gemma3", "gemma2", "mistral"])
def test_a_long_prompt_past_the_window_shares_a_forward_with_other_answers_as_its_own(arch):
    _, lean = quantised(arch, "int8")
    g = torch.Generator().manual_seed(3)
    prompt, chain, start = (torch.randint(3, 98, (n,), generator=g) for n in (70, 4, 30))
    mine, theirs = [reserved_cache(lean.config) for _ in range(2)], [reserved_cache(lean.config) for _ in range(2)]
    with torch.inference_mode():
        for cache in (mine[1], theirs[1]):
            run(lean, start[None], cache)
        batched = forward_many(lean).forward_many([Block(prompt, mine[0], keep=1), Block(chain, mine[1])])
        own = [run(lean, prompt[None], theirs[0], logits_to_keep=1), run(lean, chain[None], theirs[1])]
    assert all(torch.equal(b.logits, o.logits) for b, o in zip(batched, own))
    assert all(caches_equal(a, b) for a, b in zip(mine, theirs))


PROMPT = [2] + [5, 6, 7, 8] * 6  # repeats, so that lookup drafts; 25 tokens, past the window already
NEW = 60


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_the_engine_gives_transformers_greedy_tokens_past_the_window_in_every_mode(arch):
    model, lean = quantised(arch, "int4")
    reference = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                               pad_token_id=0)[0, len(PROMPT):].tolist()

    def tokens(drafter, k):
        engine = SpeculativeEngine(lean, drafter, set())
        return [t for e in engine.generate(PROMPT, k=k, max_new_tokens=NEW) for t in e.emitted]

    assert tokens(None, 0) == reference
    assert tokens(NgramDrafter(), 3) == reference
    assert fallback_forwards(lean) == 0


def test_what_it_does_not_cover_keeps_transformers_forward():
    dynamic = LlamaForCausalLM(LlamaConfig(**SHAPE, rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                                     "rope_theta": 10000.0}))
    assert not supported(quantise_model(dynamic, "int8"))  # its frequencies change with a forward's longest position
    partial = Phi3ForCausalLM(Phi3Config(**SHAPE, partial_rotary_factor=0.5))
    assert not supported(quantise_model(partial, "int8"))  # a rope that leaves part of each head unturned
    softcapped = float_model("gemma3")
    softcapped.config.attn_logit_softcapping = 50.0
    assert not supported(quantise_model(softcapped, "int8"))
    assert not supported(float_model("gemma3"))  # float linears
    model, lean = quantised("gemma3", "int8")
    with torch.inference_mode():
        sliding = model.generate(torch.tensor([PROMPT]), max_new_tokens=3, do_sample=False, pad_token_id=0)
        # transformers' generate makes a cache whose sliding layers drop positions: not the lean forward's
        assert torch.equal(lean.generate(torch.tensor([PROMPT]), max_new_tokens=3, do_sample=False, pad_token_id=0), sliding)
    assert fallback_forwards(lean) == 3 and isinstance(lean.forward.__self__, LeanLlama)


def test_soft_capped_attention_is_eager_attentions_under_rowwise_attention_too():
    """Gemma 2's attention soft-caps its logits: specdec's rowwise attention (transformers' forward) and
    the lean forward compute it, and agree with transformers' eager attention up to the kernels'
    round-off, far closer than the same model without the cap."""
    eager = quantise_model(float_model("gemma2"), "int8")  # transformers' own choice for Gemma 2
    model, lean = quantised("gemma2", "int8")
    uncapped, _ = quantised("gemma2-uncapped", "int8")
    ids = torch.randint(3, 98, (1, 80), generator=torch.Generator().manual_seed(9))
    with torch.inference_mode():
        want = eager(ids).logits
        off = [float((m(ids).logits - want).abs().max()) for m in (model, lean, uncapped)]
    assert off[0] == off[1] and off[0] * 10 < off[2], off
