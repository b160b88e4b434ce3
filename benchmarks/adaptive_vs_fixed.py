"""Adaptive K against plain decoding and a fixed K, measured side by side.

For each prompt the three modes run back to back in an order rotated per prompt (and per repeat),
so that drift of a shared machine hits all of them alike; a warm-up round is excluded. Prints
tokens/s per mode and the ratios over plain decoding, and checks that all three produced the same
tokens (greedy speculation is lossless).

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/adaptive_vs_fixed.py \\
        --prompts examples/calibration-prompts.jsonl --scenario creative --profile PROFILE.yaml
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from specdec_cli.decoding.control.controller import AdaptiveController
from specdec_cli.decoding.loaded_pair import load_pair
from specdec_cli.pairs.profile import read_profiles
from specdec_cli.pairs.registry import load_registry
from specdec_cli.pairs.tokenization import encode_prompt
from specdec_cli.prompts import read_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default=None)
    parser.add_argument("--models", default=None)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--scenario", default=None, help="only prompts of this scenario")
    parser.add_argument("--profile", required=True, help="profile written by calibrate-k --write")
    parser.add_argument("--fixed-k", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (1 is steadier on a shared CPU)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    spec = load_registry(args.models).pair(args.pair)
    profile = read_profiles(__import__("pathlib").Path(args.profile)).get(spec.name)
    if profile is None or not profile.matches(spec):
        raise SystemExit(f"{args.profile} holds no profile for {spec.name} calibrated with its models")
    runtime = load_pair(spec)
    engine = runtime.engine
    prompts = [p for p in read_file(args.prompts) if args.scenario is None or p.scenario == args.scenario]
    if not prompts:
        raise SystemExit("no prompts")
    encoded = [(p, encode_prompt(runtime.tokenizer, p.text)) for p in prompts]
    controller = AdaptiveController.for_pair(spec, profile)

    def run(mode: str, prompt, ids, max_new_tokens: int):
        if mode == "auto":
            k = controller.schedule(prompt.scenario)
        else:
            k = 0 if mode == "plain" else args.fixed_k
        started = time.perf_counter()
        tokens = [t for e in engine.generate(ids, k=k, max_new_tokens=max_new_tokens) for t in e.emitted]
        return tokens, time.perf_counter() - started, (k.report() if mode == "auto" else None)

    modes = ["plain", "fixed", "auto"]
    for mode in modes:  # warm-up, excluded
        run(mode, *encoded[0], 16)
    controller.reseed(profile)  # the warm-up must not move the controller's estimates

    totals = {mode: [0, 0.0] for mode in modes}
    rounds_off = probes = 0
    rows = []
    for repeat in range(args.repeats):
        for index, (prompt, ids) in enumerate(encoded):
            shift = (index + repeat) % len(modes)
            outputs = {}
            for mode in modes[shift:] + modes[:shift]:
                tokens, seconds, report = run(mode, prompt, ids, args.max_new_tokens)
                outputs[mode] = tokens
                totals[mode][0] += len(tokens)
                totals[mode][1] += seconds
                if report:
                    rounds_off += report["rounds_off"]
                    probes += report["probes"]
                rows.append((prompt.id, mode, len(tokens), seconds))
            if not outputs["plain"] == outputs["fixed"] == outputs["auto"]:
                raise SystemExit(f"prompt {prompt.id}: outputs differ between modes (speculation must be lossless)")

    speed = {mode: n / s for mode, (n, s) in totals.items()}
    result = {
        "pair": spec.name,
        "scenario": args.scenario,
        "prompts": len(encoded),
        "repeats": args.repeats,
        "fixed_k": args.fixed_k,
        "tokens_per_s": {mode: round(v, 2) for mode, v in speed.items()},
        "fixed_over_plain": round(speed["fixed"] / speed["plain"], 3),
        "auto_over_plain": round(speed["auto"] / speed["plain"], 3),
        "auto_rounds_off": rounds_off,
        "auto_probes": probes,
        "threads": torch.get_num_threads(),
    }
    if args.json:
        print(json.dumps(result))
        return
    for prompt_id, mode, n, seconds in rows:
        print(f"{prompt_id:>12}  {mode:<6} {n:4d} tokens  {seconds:7.2f} s  {n / seconds:6.1f} tok/s")
    print(f"\n{spec.name} · scenario {args.scenario or 'all'} · {len(encoded)} prompts × {args.repeats} · "
          f"{torch.get_num_threads()} thread(s)")
    for mode in modes:
        label = f"fixed K={args.fixed_k}" if mode == "fixed" else mode
        print(f"  {label:<12} {speed[mode]:6.2f} tok/s   ×{speed[mode] / speed['plain']:.3f} of plain")
    print(f"  auto: {rounds_off} rounds with speculation off, {probes} probe rounds")


if __name__ == "__main__":
    main()
