"""A tiny tied-embedding Llama saved as a model directory, the forwards that compare two loads of it
(a prompt on the dense copies, one-token forwards, a verify block, hidden states, a block without a cache),
and a command run that says which heavy modules it imported."""

import torch
from conftest import char_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_cli.decoding.kv import reserved_cache
from specdec_cli.pairs.registry import ModelSpec
from specdec_cli.pairs.sources import ModelSource


def tied_target(root, seed: int):
    """The lm_head's float weight is then the embedding, saved once."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=98, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=0, eos_token_id=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8.0)
    model.save_pretrained(root)
    char_tokenizer().save_pretrained(root)
    return root


def spec(directory, dtype):
    return ModelSpec(source=ModelSource.parse(str(directory)), dtype=dtype)


def forwards(model, prompt: int = 30) -> list[torch.Tensor]:
    """A prompt of ``prompt`` tokens, two single tokens, a block of six and one of two with hidden
    states on the engine's cache, and a forward without one: their logits (and those states)."""
    ids = torch.randint(3, model.config.vocab_size, (1, prompt + 10), generator=torch.Generator().manual_seed(2))
    out = []
    with torch.inference_mode():
        cache = reserved_cache(model.config)  # the engine's: specdec's own for a model loaded without transformers
        for start, stop in ((0, prompt), (prompt, prompt + 1), (prompt + 1, prompt + 2), (prompt + 2, prompt + 8)):
            keep = 1 if stop - start > 6 else stop - start
            out.append(model(ids[:, start:stop], cache=cache, use_cache=True, logits_to_keep=keep).logits)
        hidden = model(ids[:, prompt + 8 :], cache=cache, use_cache=True, logits_to_keep=2, output_hidden_states=[-1])
        out += [hidden.logits, hidden.hidden_states[-1], model(ids[:, :8]).logits]
    return out


# `python3 -c HEAVY_IMPORTS ARGS...`: the CLI on ARGS, then "HEAVY [...]" on stderr, the heavy modules it imported.
HEAVY_IMPORTS = r"""
import sys
from specdec_cli.cli import app  # not main(): it leaves without the teardown, before this could look

try:
    app()
except SystemExit as exit:
    assert not exit.code, exit.code
heavy = sorted(m for m in sys.modules if m in ("transformers", "torch._dynamo", "jinja2") or m.startswith("transformers."))
print("HEAVY", heavy, file=sys.stderr)
"""
