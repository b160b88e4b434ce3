"""From a pair and its engine modes to the servers that serve them. vLLM: the target as a
transformers directory (a GGUF source's converted cache directory), the pair's draft model as it
is, prompt lookup as vLLM's ``ngram``. llama.cpp: the pair's GGUF as it is, the draft model and
the head's EAGLE-3 export converted to GGUF once. And the prompts as the target's token ids, chat template applied, so that
every server sees the same tokens specdec's own loop would."""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Callable

from ..errors import UserError, read_json
from ..pairs.loading import gguf_file, transformers_directory
from ..pairs.registry import HEAD, MODEL, PairSpec
from .load_bench import EngineMode, Target
from .llama_server import LlamaConfig, draft_gguf, eagle3_gguf, speculative_flags
from .server import ManagedServer, ServerConfig, mode_port, speculative_config


def draft_directory(pair: PairSpec) -> Path:
    drafter = pair.alternate(MODEL)
    if drafter is None or drafter.model is None:
        raise UserError(f"pair {pair.name} has no draft model for a draft:K mode (add one under `drafters: model:`)")
    return transformers_directory(drafter.model.source)


def server_configs(pair: PairSpec, modes: list[EngineMode], threads: int | None = None,
                   port: int | None = None, max_model_len: int = 2048,
                   eagle3_directory: Callable[[], Path] | None = None, parallel: int = 1,
                   progress: Callable[[str], None] = lambda line: None) -> dict[str, ServerConfig | LlamaConfig]:
    """One server per mode; ``port`` is the first mode's, the next ones count up from it.
    ``eagle3_directory()`` gives the pair's head in the engine's EAGLE-3 layout (export/ writes it);
    ``parallel``: a llama.cpp server's slots, the most requests it is sent at once."""
    if modes and modes[0].engine == "llama.cpp":
        return llama_configs(pair, modes, threads, port, parallel, eagle3_directory, progress)
    model_dir = transformers_directory(pair.target.source)
    configs = {}
    for index, mode in enumerate(modes):
        if mode.method == "config":
            speculative = read_speculative_config(mode.config)
        else:
            draft = (draft_directory(pair) if mode.method == "draft_model"
                     else _eagle3(pair, eagle3_directory) if mode.method == "eagle3" else None)
            speculative = speculative_config(mode.method, mode.k, draft)
        configs[mode.name] = ServerConfig(mode.name, model_dir, pair.name, speculative,
                                          max_model_len=max_model_len, threads=threads,
                                          port=mode_port(port, index))
    return configs


def llama_configs(pair: PairSpec, modes: list[EngineMode], threads: int | None, port: int | None, parallel: int,
                  eagle3_directory: Callable[[], Path] | None, progress: Callable[[str], None]) -> dict[str, LlamaConfig]:
    target = gguf_file(pair.target.source, "llama.cpp serves GGUF")
    methods = {m.method for m in modes}
    drafts = {}
    if "draft-simple" in methods:
        drafts["draft-simple"] = draft_gguf(draft_directory(pair), progress)
    if "draft-eagle3" in methods:
        drafts["draft-eagle3"] = eagle3_gguf(_eagle3(pair, eagle3_directory, "llama-eagle3:K"),
                                             transformers_directory(pair.target.source), progress)
    return {mode.name: LlamaConfig(mode.name, target, pair.name,
                                   speculative_flags(None if mode.method == "plain" else mode.method, mode.k,
                                                     drafts.get(mode.method)),
                                   threads=threads, parallel=parallel, port=mode_port(port, index))
            for index, mode in enumerate(modes)}


def _eagle3(pair: PairSpec, eagle3_directory: Callable[[], Path] | None, mode: str = "vllm-eagle3:K") -> Path:
    if pair.alternate(HEAD) is None or eagle3_directory is None:
        raise UserError(f"pair {pair.name} has no draft head for {mode} (add one under `drafters: head:`)")
    return eagle3_directory()


def read_speculative_config(path: Path) -> dict | None:
    """A --speculative-config JSON file (`specdec export --engine vllm --out FILE`); an empty object
    (no K pays) starts the server without speculation."""
    value = read_json(path, "--modes vllm-config")
    if not isinstance(value, dict) or (value and "method" not in value):
        raise UserError(f"--modes vllm-config:{path}: expected vLLM's --speculative-config object with a \"method\" "
                        "(or {} for none)")
    return value or None


def start_all(stack: ExitStack, configs: dict[str, ServerConfig], progress: Callable[[str], None],
              start_timeout_s: float | None = None) -> dict[str, ManagedServer]:
    """Each server in turn (two cold starts at once fight for the cores), every one stopped by ``stack``."""
    servers = {}
    for name, config in configs.items():
        server = ManagedServer(config, progress=progress, **({"start_timeout_s": start_timeout_s} if start_timeout_s else {}))
        stack.enter_context(server)
        progress(f"{config.engine} for {name} ready on port {server.endpoint.port} in {server.started_s:.1f} s (log: {server.log_path})")
        servers[name] = server
    return servers


def as_target(server: ManagedServer) -> Target:
    return Target(server.endpoint, server.alive, server.died)


def encode_prompts(model_dir: Path, texts: list[tuple[str, str]], raw: bool = False) -> list[tuple[str, list[int]]]:
    """(id, text) → (id, token ids) with the target's own tokenizer and chat template."""
    from ..pairs.quiet import quiet_transformers
    from ..pairs.tokenization import encode_prompt

    tokenizer = quiet_transformers().AutoTokenizer.from_pretrained(str(model_dir))
    return [(pid, encode_prompt(tokenizer, text, raw)) for pid, text in texts]


def progress_line(line: str) -> None:
    """A progress line on stderr: the server start-ups are the slow part of a run."""
    print(f"specdec: {line}", file=sys.stderr, flush=True)
