"""`specdec export --engine ENGINE`: the calibrated K (folded by a traffic mix, or an engine bench's
per-batch-size table) as the config and command line a serving engine takes."""

# torch and transformers are imported only when a model directory has to be found or converted.
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import own_files
from ..atomic import check_writable, write_atomically
from ..errors import UserError
from .common import (
    JsonOption,
    ModelsOption,
    PairOption,
    ProfileOption,
    plain_console,
    resolve_pair,
    user_errors,
    warning_line,
    write_output,
    WRITE_FAILED,
)

ENGINE_NAMES = ("vllm", "sglang", "llama.cpp", "transformers")


@user_errors
def export(
    engine: Annotated[str, typer.Option("--engine", "-e", metavar="ENGINE", help="vllm, sglang, llama.cpp or transformers.")],
    pair: PairOption = None,
    profile: ProfileOption = None,
    traffic: Annotated[Optional[str], typer.Option("--traffic", metavar="MIX", help="Share of output tokens per scenario, like code=0.6,chat=0.4: the scenario Ks are folded into the one K that makes this mix fastest (engines take one K for all requests). Default: the profile's K over all its calibration prompts.")] = None,
    from_bench: Annotated[Optional[Path], typer.Option("--from-bench", metavar="FILE", help="JSON of `specdec bench --engine vllm --concurrency ...`: K from the engine's own measured speed, and (vLLM) the per-batch-size K table from its concurrency levels.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", metavar="FILE", help="Write the engine's config file: vLLM's --speculative-config JSON, SGLang's adaptive config (else its command), the llama-server line, transformers' generation_config.json.")] = None,
    drafter: Annotated[Optional[str], typer.Option("--drafter", metavar="KIND", help="Which of the pair's drafters the engine runs: head (as eagle3), model (draft_model) or ngram. Default: the pair's default drafter.")] = None,
    draft_dir: Annotated[Optional[str], typer.Option("--draft-dir", metavar="DIR", help="Where the engine finds a draft head in EAGLE-3 layout (write it with `specdec export-head`). Default: PAIR-eagle3.")] = None,
    json_out: JsonOption = False,
    models: ModelsOption = None,
) -> None:
    """Write the calibrated speculation for a serving engine, and say where its K came from.

    Acceptance belongs to the pair and the traffic and carries over; costs belong to the engine and
    the hardware and do not. Without --from-bench, K comes from specdec's own loop and the export
    warns how much the predicted speed-up depends on it. Engines take one K for all requests, so
    per-scenario Ks are folded by --traffic into the K that maximises the mix's expected tokens per
    second; the output says what was folded. With --from-bench a calibration profile is optional.

    Exit codes: 0 done; 2 bad input; 3 printed but --out could not be written.
    """
    if engine not in ENGINE_NAMES:
        raise UserError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINE_NAMES)}")
    from ..export.engines import build
    from ..export.fold import parse_traffic
    from ..export.llama_flags import probe
    from ..export.plan import load_profile, make_plan
    from ..pairs.profile import section_name

    shares = parse_traffic(traffic) if traffic is not None else None
    if from_bench is not None and not from_bench.is_file():
        raise UserError(f"--from-bench file not found: {from_bench}")
    if out is not None:
        check_writable(out, "--out", ours=own_files.engine_config)
    spec = resolve_pair(models, pair)
    pair_profile, path = load_profile(profile, spec, warning_line, required=from_bench is None)
    plan = make_plan(engine, spec, pair_profile, path, shares, from_bench, draft_dir, drafter)
    result = build(engine, plan, probe() if engine == "llama.cpp" else None,
                   str(out.expanduser().absolute()) if out else None)
    failed = out is not None and not write_output("--out", out, lambda: write_atomically(out, result.artifact))
    if json_out:
        print(json.dumps({"engine": result.engine, "pair": plan.pair, "k": plan.k, "origin": plan.origin,
                          "scenario_ks": plan.scenario_ks, "per_batch_size": plan.table,
                          "profile": {"path": str(path), "section": section_name(spec)} if pair_profile else None, "commands": list(result.commands),
                          "notes": list(result.notes), **result.extra, "out": str(out) if out and not failed else None}, indent=2))
    else:
        console = plain_console()
        console.print(f"# specdec export --engine {engine}: pair {plan.pair}, K {plan.k}", markup=False)
        for note in result.notes:
            console.print(f"# {note}", markup=False)
        for command in result.commands:
            console.print(command, markup=False, soft_wrap=True)
        if out is not None and not failed:
            console.print(f"# {result.artifact_kind} written to {out}", markup=False)
    if failed:
        raise typer.Exit(WRITE_FAILED)
