"""Tiny seeded Llama-style models, built from a config in the tests: no downloads, milliseconds a forward.

The tests have a specdec cache of their own, so that no test writes into the user's."""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from specdec_cli.pairs.cache_dir import cache_root
from specdec_cli.runtime import kernel_checksum, native_kernels
from specdec_cli.serving import environment

if TYPE_CHECKING:  # transformers is imported where a model is built: xdist's controller process builds none
    from transformers import LlamaForCausalLM

TEST_CACHE = "SPECDEC_TEST_CACHE"  # where the tests keep their cache; the project's .test-cache/ if unset
PROJECT_CACHE = Path(__file__).resolve().parent.parent / ".test-cache"  # ignored by git


def pytest_configure(config):
    """``$SPECDEC_CACHE`` is ``$SPECDEC_TEST_CACHE`` or the project's ``.test-cache/``, kept between
    runs (the conversion, the prepared target, the compiled kernels and block costs are made once),
    and so are the caches and configuration that libraries keep under ``$XDG_CACHE_HOME`` and
    ``$XDG_CONFIG_HOME`` (matplotlib's fonts, vLLM's model infos, specdec's profile). vLLM's
    environment and llama.cpp's build stay where ``install.sh test`` built them, in the user's cache."""
    os.environ.setdefault(environment.ENV_VAR, str(environment.vllm_env()))
    os.environ.setdefault(environment.LLAMA_CPP_VAR, str(environment.llama_directory()))
    users = None if os.environ.get("SPECDEC_KERNELS") else native_kernels.library_path(cache_root())
    root = os.environ.setdefault(TEST_CACHE, str(PROJECT_CACHE))  # a nested run shares it
    os.makedirs(root, exist_ok=True)
    os.environ["SPECDEC_CACHE"] = root
    os.environ.setdefault("SPECDEC_KERNELS", os.path.join(root, "kernels"))  # compiled once, for tests with caches of their own
    if users is not None:
        copy_kernels(users, native_kernels.library_path(Path(root)))
    for variable, name in (("XDG_CACHE_HOME", ".xdg-cache"), ("XDG_CONFIG_HOME", ".xdg-config")):
        os.environ[variable] = os.path.join(root, name)
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        # Workers share the cores: a torch thread waiting at a barrier for a descheduled one stalls
        # every small forward, so each worker computes on one thread.
        torch.set_num_threads(1)


def pytest_collection_finish():
    """What is imported and collected by now (torch, transformers, the test modules: some 480,000
    objects) lives until the run ends; frozen, the garbage collector's full collections stop walking it
    (docs/testing.md)."""
    gc.freeze()


MARKED_FILES = pytest.StashKey[list]()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The files that hold this run's tests marked ``cpu_kernels``, once -m and -k chose them:
    test_cpu_paths.py runs those again on AVX2's kernels, and its pytest collects those files alone
    (collecting every test module took it 11 s against 5)."""
    config.stash[MARKED_FILES] = sorted({str(item.path) for item in items if item.get_closest_marker("cpu_kernels")})


def copy_kernels(built: Path, kept: Path) -> None:
    """The kernel library that ``install.sh`` compiled into the user's cache, copied (read there, never
    written) to where the tests keep theirs when they have none: a compile is some 20 s of a clean
    run's CPU. One that does not match its record is left alone, and the tests compile their own."""
    if built == kept or kept.exists() or not built.exists() or kernel_checksum.damage(built):
        return
    kept.parent.mkdir(parents=True, exist_ok=True)
    record = kernel_checksum.record_path(built)
    shutil.copyfile(record, kernel_checksum.record_path(kept))
    shutil.copyfile(built, kept.with_suffix(".copying"))
    os.replace(kept.with_suffix(".copying"), kept)  # the library last, whole: a load finds both or compiles


@pytest.fixture(autouse=True)
def threads_kept():
    """A command invoked in-process with `--threads N` sets torch's threads for the whole worker; the
    next tests get the worker's own count back (two threads on a shared core made the tiny models'
    exact-distribution checks up to 30× slower for the rest of the run)."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def pytest_runtest_setup(item):
    """A grouped test (one engine's real-server tests; a module whose costly fixture is made once a
    test run) that pytest-xdist did not put on its group's worker fails at setup instead of running
    beside the group's others. loadgroup marks a grouped test by a suffix of its node id, which
    pytest 9.2 drops (pytest-xdist#1386), hence the test extra's pin below it."""
    worker = hasattr(item.config, "workerinput")  # set on an xdist worker, not inherited by a nested pytest
    if (worker and getattr(item.config.option, "loadgroup", False)
            and item.get_closest_marker("xdist_group") and "@" not in item.nodeid):
        pytest.fail("pytest-xdist did not keep a group's tests on one worker (pytest >= 9.2 drops "
                    "loadgroup's groups): pip install -e '.[test]', or run with -n 0", pytrace=False)


def tiny_llama(seed: int, vocab_size: int = 98, hidden: int = 32, layers: int = 2, **overrides) -> LlamaForCausalLM:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=None,
        tie_word_embeddings=False,
        **overrides,
    )
    model = LlamaForCausalLM(config)
    # Wider logits than the default init: a random model then has clear argmaxes (no near-ties
    # between a 1-token and a multi-token forward), like a trained one.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.eval()


@pytest.fixture(scope="session")
def vllm_servers(tmp_path_factory):
    """A plain vLLM server and one started from specdec's exported config, for every test that only
    talks to a server (engine_support.start_vllm_servers)."""
    from engine_support import start_vllm_servers

    yield from start_vllm_servers(tmp_path_factory.mktemp("vllm-servers"))


@pytest.fixture(scope="session")
def eagle3_bench_killed(tmp_path_factory):
    """The vLLM bench whose EAGLE-3 config-file server is killed mid-run (engine_support), read by a
    faults test and an export test (both of the group ``vllm``, so on one worker)."""
    from engine_support import eagle3_bench_killed_mid_run

    return eagle3_bench_killed_mid_run(tmp_path_factory.mktemp("eagle3-bench"))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A specdec cache of the test's own, for a test that counts or damages what is in it."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def models(pair_dir) -> str:
    """The tiny pair's models.yaml (``pair_dir``), as a command line names it."""
    return str(pair_dir / "models.yaml")


def one_line_error(result, code: int = 2) -> str:
    """A CliRunner result that failed as a user's mistake should: exit ``code``, one `specdec: error:`
    line on stderr and no traceback. The message, without its prefix."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: error: "), result.stderr
    return lines[0].removeprefix("specdec: error: ")


@pytest.fixture(scope="session")
def target():
    return tiny_llama(seed=1)


PROMPT = [0, 5, 6, 7, 8, 5, 6, 7, 9, 10]  # the tiny target's prompt: it repeats itself, so lookup finds matches


def decode(target, drafter, k, prompt=PROMPT, *, eos=(1,), block_plan=None, max_new_tokens=40, **kwargs):
    """The engine run to its end: (the tokens emitted, the round events)."""
    from specdec_cli.decoding.engine import SpeculativeEngine

    engine = SpeculativeEngine(target, drafter, set(eos), block_plan)
    events = list(engine.generate(prompt, k=k, max_new_tokens=max_new_tokens, **kwargs))
    return [t for e in events for t in e.emitted], events


@pytest.fixture(scope="session")
def plain(target):
    """Plain decoding of PROMPT: what every speculative run on it must equal."""
    return decode(target, None, 0)[0]


@pytest.fixture(scope="session")
def draft():
    return tiny_llama(seed=2, hidden=16, layers=1)


CHARS = [chr(c) for c in range(32, 127)]  # printable ASCII, one token each


def char_tokenizer(swap: tuple[str, str] | None = None):
    """A character-level tokenizer: ids 0-2 are <s>, </s>, <unk>, then printable ASCII.

    ``swap`` trades two characters' ids: same tokens, different meaning, an incompatible draft.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2}
    for token in CHARS:
        vocab[token] = len(vocab)
    if swap:
        a, b = swap
        vocab[a], vocab[b] = vocab[b], vocab[a]
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def similar_draft(target: LlamaForCausalLM, seed: int, noise: float) -> LlamaForCausalLM:
    """The target with noise on its weights: a draft that agrees often, but not always."""
    from transformers import LlamaForCausalLM

    draft = LlamaForCausalLM(target.config).eval()
    draft.load_state_dict(target.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(noise * parameter.std() * torch.randn(parameter.shape, generator=generator))
    return draft


@pytest.fixture(scope="session")
def similar(target):
    return similar_draft(target, seed=5, noise=0.2)


def save_random_head(directory, target: LlamaForCausalLM, seed: int = 3) -> None:
    """An untrained draft head for ``target``: drafts poorly, but loads and runs like a trained one."""
    from specdec_cli.decoding.head_files import save_head, target_identity
    from specdec_cli.decoding.head_network import DraftHead, head_config

    torch.manual_seed(seed)
    head = DraftHead(head_config(target))
    save_head(directory, head, {"target": target_identity(target, "target"), "layer": head.config_dict})


@pytest.fixture(scope="session")
def pair_dir(tmp_path_factory, target, similar):
    """Tiny target and draft saved as model directories with a character tokenizer, a draft head, and
    a models.yaml (``tiny-alt``: n-gram by default, its draft model and head named by relative paths)."""
    root = tmp_path_factory.mktemp("pair")
    for name, model, tokenizer in (
        ("target", target, char_tokenizer()),
        ("draft", similar, char_tokenizer()),
        ("alien", similar, char_tokenizer(swap=("a", "b"))),
    ):
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    save_random_head(root / "head", target)
    (root / "models.yaml").write_text(
        f"""
default: tiny
pairs:
  tiny:
    target: {root / 'target'}
    draft: {root / 'draft'}
    k: 3
    scenarios: {{code: 5}}
  tiny-ngram:
    target: {root / 'target'}
    draft: ngram
  tiny-alt:
    target: {root / 'target'}
    draft: ngram
    drafters: {{model: ./draft, head: head}}
    k: 3
  alien:
    target: {root / 'target'}
    draft: {root / 'alien'}
  missing:
    target: {root / 'nowhere'}
    draft: ngram
"""
    )
    return root
