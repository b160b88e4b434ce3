"""From a pair, its calibration profile, an optional traffic mix and an optional engine bench to the
``ExportPlan`` every engine's export is built from: which drafter, which K, and where that K came from."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..errors import UserError
from ..pairs.profile import PairProfile, profile_path, read_profiles, section_name
from ..pairs.free_kinds import FREE_KINDS
from ..pairs.registry import HEAD, MODEL, NGRAM, DrafterSpec, PairSpec
from ..runtime import threads
from .bench_table import levels as bench_levels, lookup_bounds, read_bench, table
from .engines import EngineDrafter, ExportPlan
from .fold import Fold, fold, sensitivity

VLLM_METHOD = {HEAD: "eagle3", MODEL: "draft_model", NGRAM: "ngram"}


def load_profile(explicit: str | None, pair: PairSpec, warn, required: bool = True) -> tuple[PairProfile | None, Path]:
    """The pair's calibration profile; ``required=False`` (an engine bench gives K) allows none,
    unless one was named on the command line."""
    path = profile_path(explicit, pair)
    if explicit and not path.is_file():
        raise UserError(f"profile file not found: {path}")
    profile = read_profiles(path).get(section_name(pair))
    if profile is None and not required and not explicit:
        return None, path
    if profile is None:
        raise UserError(f"no profile of pair {section_name(pair)!r} in {path}; measure one with "
                        f"`specdec calibrate-k --pair {pair.name} --prompts FILE --write`")
    why = profile.mismatch(pair)
    if why:
        warn(f"{path}: the profile of {pair.name!r} does not fit the pair as configured now: {why}")
    return profile, path


def engine_drafter(spec: DrafterSpec | None, eagle3_dir: str, where) -> EngineDrafter | None:
    """The drafter as the engine loads it: a model by its transformers directory, a head by its
    eagle3 export directory (written by export-head)."""
    if spec is None:
        return None
    if spec.kind == HEAD:
        return EngineDrafter(HEAD, eagle3_dir, lookup=spec.lookup)
    if spec.kind == MODEL:
        return EngineDrafter(MODEL, where(spec.model.source), lookup=spec.lookup)
    return EngineDrafter(NGRAM, None, spec.min_ngram, spec.max_ngram)


def model_directory(source) -> str:
    """A source as a serving engine loads it: a hub id as it is, anything else as a transformers
    directory (a GGUF's converted copy: vLLM on a CPU reads no GGUF)."""
    if source.kind == "hub" and not source.is_gguf:
        return source.location
    threads.choose_before_torch()  # a conversion computes: see runtime/threads.py
    from ..pairs.loading import transformers_directory  # torch only when an export needs a directory

    return str(transformers_directory(source))


def llama_target(source) -> str:
    """For llama.cpp: the GGUF file itself where the source is one."""
    if source.is_gguf and source.kind != "hub":
        return str(source.local_path())
    return model_directory(source)


def chosen_drafter(pair: PairSpec, kind: str | None) -> DrafterSpec:
    """The pair's default drafter, or the one of ``kind`` it names (head, model, ngram)."""
    if kind is None:
        return pair.drafter
    if kind not in VLLM_METHOD:
        raise UserError(f"--drafter {kind!r}: choose one of {', '.join(VLLM_METHOD)}")
    spec = pair.alternate(kind)
    if spec is None:
        raise UserError(f"--drafter {kind}: pair {pair.name} has no {kind} drafter (see its `drafters:` in models.yaml)")
    return spec


def make_plan(engine: str, pair: PairSpec, profile: PairProfile | None, profile_file: Path, shares: dict[str, float] | None,
              bench: Path | None, eagle3_dir: str | None, drafter_kind: str | None = None) -> ExportPlan:
    spec = chosen_drafter(pair, drafter_kind)
    if spec.kind in FREE_KINDS and engine not in FREE_KINDS[spec.kind].engines:
        raise UserError(f"pair {pair.name} drafts with {FREE_KINDS[spec.kind].text}, which {engine} has no "
                        f"speculative method for: export its ngram, model or head drafter (--drafter KIND)")
    eagle3_dir = eagle3_dir or f"{pair.name}-eagle3"
    target = llama_target(pair.target.source) if engine == "llama.cpp" else model_directory(pair.target.source)
    drafter = engine_drafter(spec, eagle3_dir, model_directory)
    fallback = None
    if spec.kind == HEAD:
        fallback = engine_drafter(pair.alternate(MODEL), eagle3_dir, model_directory) or engine_drafter(pair.alternate(NGRAM), eagle3_dir, model_directory)
    if profile is None and shares:
        raise UserError(f"--traffic folds the profile's scenario Ks, and pair {pair.name} has no profile in {profile_file}")
    scenario_ks = {name: s.k for name, s in profile.scenarios.items()} if profile else {}
    notes: list[str] = [] if profile else [f"no calibration profile of {pair.name} in {profile_file}: K comes from the engine bench alone"]
    if spec.beside:
        notes.append(f"what `-k auto` weighs beside the pair's drafter ({', '.join(spec.beside)}) is specdec's own: not exported")
    folded: Fold | None = fold(profile, shares) if shares else None
    where = f"profile {profile_file} (pair {profile.pair!r}, calibrated {profile.calibrated})" if profile else ""
    if folded:
        notes.append(folded.describe())
    if bench is not None:
        measured = read_bench(bench)
        levels = bench_levels(measured, VLLM_METHOD[drafter.kind], bench)
        bounds = lookup_bounds(measured, levels[0].best_k) if drafter.kind == NGRAM else None
        if bounds and bounds != (drafter.min_ngram, drafter.max_ngram):
            notes.append(f"prompt lookup {bounds[0]}-{bounds[1]} as the engine bench measured it (the pair's own "
                         f"bounds are {drafter.min_ngram}-{drafter.max_ngram})")
            drafter = replace(drafter, min_ngram=bounds[0], max_ngram=bounds[1])
        first = levels[0]
        k = first.best_k
        origin = (f"K {k} from the engine bench {bench}: the engine's own measured speed at concurrency "
                  f"{first.concurrency} ({first.gain:.2f}x its plain decoding at K {k})")
        rows = table(levels) if engine == "vllm" else None
        if rows:
            origin += f"; the per-batch-size table from its {len(levels)} concurrency levels"
        if folded and folded.k != k:
            notes.append(f"specdec's own loop folds this traffic to K {folded.k}; the engine bench's K {k} is used "
                         "(it measured this engine's costs on its own prompts)")
        return ExportPlan(pair.name, target, drafter, k, origin, scenario_ks, rows, tuple(notes), fallback)
    if folded:
        k, by_k = folded.k, folded.by_k
        by_k = {j: by_k[j] for j in (k - 1, k, k + 1) if j in by_k}
        basis = "the traffic mix"
    else:
        section = profile.overall or next(iter(profile.scenarios.values()))
        k, by_k = section.k, sensitivity(section, section.best_k)
        basis = "all the calibration prompts" if profile.overall else "its only scenario"
    spread = ", ".join(f"{v:.2f}x at K {j}" for j, v in by_k.items())
    origin = (f"K {k} from specdec's own loop ({where}, {basis}). WARNING: specdec's batch-1 loop is not this "
              f"engine, whose verify and draft costs differ, so K may be off; specdec's cost model predicts {spread} "
              "(run `specdec bench --engine vllm --concurrency ...` and export with --from-bench for the engine's own K)")
    return ExportPlan(pair.name, target, drafter, k, origin, scenario_ks, None, tuple(notes), fallback)
