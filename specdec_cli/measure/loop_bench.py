"""Benchmark modes side by side: this loop plain and speculative, and transformers' own generate.

Modes run interleaved prompt by prompt (with a rotated order, interleaved.py's harness, calibration's
too) so that machine drift hits them all alike, after one excluded warm-up pass. Every speculative figure is reported next to plain decoding
of the same target on the same prompts in the same run, and every mode's tokens are compared with
plain's: a speed-up with different output is not a speed-up.

Each mode takes the pair's drafter of its kind (``LoadedPair.drafter_of``), not only the default one:
a pair drafted by n-gram lookup by default still benches its draft model and its draft head.
``auto`` is `generate -k auto`: the default drafter, K chosen round by round, seeded from the
pair's calibration profile (read, never written); ``auto-ungated`` the same without the learned
drafter's confidence gate (gate.py: every round drafts the K chosen), to see what the gate gives.

``MODE@RULE`` runs a mode under another acceptance rule than the race (``head:3@top:3``,
``spec:3@standard``); its twin under the race runs beside it, interleaved, and for a lossy rule
``lossy.py`` reports what the rule cost. With ``samples`` > 1 each prompt
runs that many times per mode, with seeds seed, seed+1, … shared by every mode (paired).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers.generation.streamers import BaseStreamer

from ..decoding.acceptance import AcceptRule, SamplingParams, parse_rule
from ..decoding.drafters.lookup import NgramDrafter
from ..decoding.engine import KSchedule, SpeculativeEngine
from ..decoding.events import RoundCounts
from ..decoding.rules import check_tree_rule
from ..decoding.kv import input_device
from ..decoding.loaded_pair import LoadedPair, composed, free_drafter, load_pair
from ..errors import UserError
from ..limits import MAX_K
from ..pairs.profile import PairProfile, ProfileWatcher
from ..pairs.tokenization import encode_prompt
from ..pairs.free_kinds import FREE_KINDS
from ..pairs.registry import HEAD, MODEL, STORE, DrafterSpec
from ..prompts import Prompt, check_fit
from . import lossy
from .interleaved import run_interleaved
from .mode_kinds import (AUTO_KINDS, DRAFTS_TREES, TREE_KINDS, WITHOUT_K, drafter_of, engine_kinds, free_kinds_of,
                         mode_kinds, mode_names)
from .mode_figures import Sample, figures, predicted_from_rounds

NEEDS = {MODEL: "a draft model", HEAD: "a draft head", STORE: "a store"}


@dataclass(frozen=True)
class Mode:
    kind: str
    k: int = 0
    rule: AcceptRule = AcceptRule()

    def __str__(self) -> str:
        name = f"{self.kind}:{self.k}" if self.kind not in WITHOUT_K else self.kind
        return name if self.rule.raced else f"{name}@{self.rule}"  # standard is lossless, yet not the race

    @property
    def lossless_twin(self) -> "Mode":
        return Mode(self.kind, self.k)

    @property
    def drafter_kind(self) -> str | None:
        """The kind of drafter the mode runs (model, head, ngram); None for plain decoding and for
        auto (whichever drafter the pair runs by default)."""
        return drafter_of(self.kind)


def _items(text: str) -> list[str]:
    """Comma-separated modes, where a rule's own comma (``head:3@typical:0.3,0.09``) stays with it."""
    items: list[str] = []
    for part in filter(None, (part.strip() for part in text.split(","))):
        if items and "@" in items[-1] and part.replace(".", "", 1).isdigit():
            items[-1] += "," + part
        else:
            items.append(part)
    return items


def parse_modes(text: str) -> list[Mode]:
    """Modes in order, plain first; a mode under another rule than the race brings its twin under the
    race (what it is measured against)."""
    modes = []
    for full in _items(text):
        item, at, rule_text = full.partition("@")
        rule = parse_rule(rule_text, f"mode {full!r}: rule") if at else AcceptRule()
        kind, _, k = item.partition(":")
        if at and (kind not in engine_kinds() or kind == "plain"):
            raise UserError(f"mode {full!r}: a rule applies to this loop's speculative modes (spec, ngram, head, "
                            "ngram+spec, ngram+head, auto), not to plain decoding or transformers' generate")
        if kind not in mode_kinds():
            raise UserError(f"unknown mode {item!r}; modes: {mode_names()}")
        if kind in DRAFTS_TREES:
            _check_tree_rule(full, rule)
        if kind in WITHOUT_K:
            if k:
                raise UserError(f"mode {kind!r} takes no K")
            modes.append(Mode(kind, 0, rule))
            continue
        if not k.isdigit() or not 1 <= int(k) <= MAX_K:
            raise UserError(f"mode {item!r} needs a K from 1 to {MAX_K}, as in {kind}:4")
        modes.append(Mode(kind, int(k), rule))
    if not modes:
        raise UserError("no modes given")
    if Mode("plain") not in modes:
        modes.insert(0, Mode("plain"))  # every figure is relative to it
    for mode in [m for m in modes if not m.rule.raced and m.lossless_twin not in modes]:
        modes.insert(modes.index(mode), mode.lossless_twin)
    return list(dict.fromkeys(modes))


def with_rule(modes: list[Mode], rule: AcceptRule) -> list[Mode]:
    """``bench --accept RULE``: every speculative mode of this loop also runs under the rule."""
    if rule.raced:
        return modes
    for mode in modes:
        if mode.kind in DRAFTS_TREES:
            _check_tree_rule(f"{mode} (--accept {rule})", rule)
    extra = [Mode(m.kind, m.k, rule) for m in modes if m.kind in engine_kinds() and m.kind != "plain" and m.rule.raced]
    return list(dict.fromkeys(modes + extra))


def _check_tree_rule(mode: str, rule: AcceptRule) -> None:
    """A mode that may verify trees is refused a lossy rule before anything runs, as `generate --tree`
    is (the engine refuses it too, from the drafter it is built with, whatever wraps the tree)."""
    try:
        check_tree_rule(rule)
    except UserError as exc:
        raise UserError(f"mode {mode}: {exc}") from None


@dataclass
class Bench:
    runtime: LoadedPair
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0
    profile: PairProfile | None = None  # seeds mode auto
    samples: int = 1  # runs per prompt and mode, seeds seed .. seed + samples - 1

    def runner(self, mode: Mode) -> Callable[[list[int], Prompt, int], Sample]:
        """A fresh runner: this loop's modes on a fresh engine (``engine_for``), transformers' on its generate."""
        if mode.kind in engine_kinds():
            engine, k_for = self.engine_for(mode)
            return lambda ids, prompt, seed: self._run_engine(engine, k_for(prompt), ids, prompt, seed, mode.rule)
        kwargs = {}
        if mode.kind == "hf-assisted":
            # A constant schedule and no confidence cut-off: K drafts every round, like spec:K.
            kwargs = dict(assistant_model=self._drafter(mode)[1].model, num_assistant_tokens=mode.k,
                          num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
        elif mode.kind == "hf-lookup":
            kwargs = dict(prompt_lookup_num_tokens=mode.k, max_matching_ngram_size=NgramDrafter().max_ngram)
        return lambda ids, prompt, seed: self._run_hf(kwargs, ids, prompt, seed)

    def engine_for(self, mode: Mode) -> tuple[SpeculativeEngine, Callable[[Prompt], int | KSchedule]]:
        """One of this loop's modes as a fresh engine and each prompt's K: the mode's own, or for auto
        a schedule of a fresh controller that has learnt nothing yet (as `generate -k auto` gives each
        prompt); every drafter that learns as it runs (token recycling, the suffix memory) new as well."""
        if mode.kind in AUTO_KINDS:
            pair = self.runtime.pair
            kinds = tuple(kind for kind in free_kinds_of(mode.kind, pair.drafter.beside) if pair.alternate(kind) is not None)
            engine = self.runtime.fresh_engine(kinds)
            trees = mode.kind == "auto+tree"
            if trees and self.runtime.pair.drafter.kind != HEAD:
                raise UserError(f"mode {mode} needs a pair drafted by its head; "
                                f"pair {self.runtime.pair.name!r} drafts with {self.runtime.pair.drafter.kind!r}")
            controller = self.runtime.controller(self.profile, trees, gating=mode.kind != "auto-ungated")
            return engine, lambda prompt: controller.schedule(prompt.scenario)
        drafter = None
        if mode.drafter_kind in FREE_KINDS:
            drafter = free_drafter(self._spec(mode), self.runtime.target.model.config.get_text_config().vocab_size)
        elif mode.drafter_kind in (MODEL, HEAD):
            # The pair's model or head as it is (a ModelDrafter keeps its trained output layer),
            # with prompt lookup first exactly when the mode says so.
            drafter = composed(self._drafter(mode)[0], mode.kind.startswith("ngram+"), mode.kind in TREE_KINDS)
        engine = SpeculativeEngine(self.runtime.target.model, drafter, self.runtime.eos_token_ids, self.runtime.block_plan)
        return engine, lambda prompt: mode.k

    def _drafter(self, mode: Mode):
        """The pair's drafter for a spec, hf-assisted or head mode, refused in the mode's words."""
        self._spec(mode)
        return self.runtime.drafter_of(mode.drafter_kind)

    def _spec(self, mode: Mode) -> DrafterSpec:
        """The pair's drafter of the mode's kind, refused in the mode's words where it has none."""
        spec = self.runtime.pair.alternate(mode.drafter_kind)
        if spec is None:
            how = "list one under `drafters:` in models.yaml" if mode.drafter_kind == STORE else "use --draft, or list one under `drafters:` in models.yaml"
            raise UserError(f"mode {mode} needs {NEEDS[mode.drafter_kind]}, and pair {self.runtime.pair.name!r} has none ({how})")
        return spec

    def _run_engine(self, engine: SpeculativeEngine, k: int | KSchedule, ids: list[int], prompt: Prompt, seed: int,
                    rule: AcceptRule) -> Sample:
        stamps, tokens, sample = [], [], Sample(prompt, [], 0.0, 0.0, [], seed=seed)
        started = time.perf_counter()
        for event in engine.generate(ids, k=k, max_new_tokens=self.max_new_tokens, sampling=self.sampling, seed=seed,
                                     rule=rule):
            stamps.append((time.perf_counter(), len(event.emitted)))
            tokens += event.emitted
            sample.add(event)
            sample.drafts.append((event.source, len(event.drafted), event.accepted))
            if event.asked:
                sample.by_drafter.setdefault(event.source, RoundCounts()).add(event)
        return _timed(sample, tokens, started, stamps)

    def _run_hf(self, kwargs: dict, ids: list[int], prompt: Prompt, seed: int) -> Sample:
        model = self.runtime.target.model
        streamer = _StampStreamer()
        sampling = self.sampling
        options = dict(do_sample=False) if sampling.greedy else dict(
            do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or None, top_p=sampling.top_p)
        eos = sorted(self.runtime.eos_token_ids)
        torch.manual_seed(seed)
        started = time.perf_counter()
        model.generate(
            torch.tensor([ids], device=input_device(model)), attention_mask=None, max_new_tokens=self.max_new_tokens,
            eos_token_id=eos, pad_token_id=self.runtime.tokenizer.pad_token_id or eos[0], streamer=streamer,
            **options, **kwargs,
        )
        stamps = [(at, len(chunk)) for at, chunk in streamer.chunks]
        sample = _timed(Sample(prompt, [], 0.0, 0.0, [], rounds=len(stamps), seed=seed),  # a streamed chunk a round
                        [t for _, chunk in streamer.chunks for t in chunk], started, stamps)
        if "assistant_model" in kwargs:
            # Constant schedule: K drafts a round, and each round after the first token (which
            # prefill gives) emits accepted + 1. Prompt lookup drafts a varying number that the
            # streamer does not show, so its acceptance rate is left unknown rather than guessed.
            sample.accepted = sum(len(chunk) - 1 for _, chunk in streamer.chunks[1:])
            sample.drafted = (len(streamer.chunks) - 1) * kwargs["num_assistant_tokens"]
        return sample


class _StampStreamer(BaseStreamer):
    """Records when generate hands out each chunk of new tokens (the first put is the prompt)."""

    def __init__(self):
        self.prompt_seen = False
        self.chunks: list[tuple[float, list[int]]] = []

    def put(self, value):
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.chunks.append((time.perf_counter(), value.reshape(-1).tolist()))

    def end(self):
        pass


def _timed(sample: Sample, tokens: list[int], started: float, stamps: list[tuple[float, int]]) -> Sample:
    sample.tokens = tokens
    sample.wall_s = (stamps[-1][0] if stamps else time.perf_counter()) - started
    sample.ttft_s = stamps[0][0] - started if stamps else sample.wall_s
    previous = stamps[0][0] if stamps else started
    for at, count in stamps[1:]:
        sample.latencies += [(at - previous) / count] * count if count else []
        previous = at
    return sample


def run(bench: Bench, modes: list[Mode], prompts: list[Prompt], encode, progress=None) -> dict[Mode, list[Sample]]:
    """Every mode on every prompt (``bench.samples`` times, a trial each) by the one harness
    (interleaved.py): one warm-up pass excluded, the modes' order rotated per trial. With a lossy
    mode, engine outputs are scored (NLL, task answers) after their timed region."""
    encoded = [encode(p) for p in prompts]
    check_fit(prompts, encoded, bench.runtime.engine.context_length)  # before a mode loads or runs
    runners = {mode: bench.runner(mode) for mode in modes}
    scored = any(not mode.rule.lossless for mode in modes)
    samples: dict[Mode, list[Sample]] = {mode: [] for mode in modes}

    def warm_up() -> None:  # first-call allocations and lazy inits are nobody's cost
        for mode in modes:
            runners[mode](encoded[0][:], prompts[0], bench.seed)
        # auto and the drafters that learn start afresh, untaught by first-call costs and prompt 0
        runners.update({mode: bench.runner(mode) for mode in modes})

    def one(trial: tuple[Prompt, list[int], int], mode: Mode) -> None:
        prompt, ids, seed = trial
        sample = runners[mode](ids, prompt, seed)
        if scored and mode.kind in engine_kinds():
            lossy.score(sample, bench.runtime.target.model, bench.runtime.tokenizer, ids)
        samples[mode].append(sample)

    trials = [(prompt, ids, seed) for prompt, ids in zip(prompts, encoded)
              for seed in range(bench.seed, bench.seed + bench.samples)]
    run_interleaved(trials, modes, one, warm_up, (lambda done, total: progress()) if progress else None)
    return samples


def bench_pair(spec, modes: list[Mode], prompts: list[Prompt], max_new_tokens: int, sampling: SamplingParams,
               seed: int = 0, watcher: ProfileWatcher | None = None, samples: int = 1,
               progress=None) -> tuple[LoadedPair, dict]:
    """The pair ``spec`` loaded, ``modes`` run on ``prompts`` (``run``) and ``report``ed: what
    `specdec bench` and an engine bench's own-loop reference both do. ``watcher``: the profile that
    seeds `auto`, used only if measured on the kernels the target loaded with. The runtime, for a manifest."""
    runtime = load_pair(spec)
    if watcher is not None:
        watcher.expect(runtime.target.computed_by())
    bench = Bench(runtime, max_new_tokens, sampling, seed, watcher.profile if watcher else None, samples)
    measured = run(bench, modes, prompts, lambda p: encode_prompt(runtime.tokenizer, p.text), progress)
    return runtime, report(measured, samples, seed)


def report(samples: dict[Mode, list[Sample]], draws: int = 1, seed: int = 0) -> dict:
    """Per mode and per scenario, with predicted next to measured speed-up for this loop's modes; and
    per lossy mode, its bill against its lossless twin (``lossy.compare``)."""
    plain = samples[Mode("plain")]
    one_token_s = sum(s.verify_s for s in plain) / max(sum(s.rounds for s in plain), 1)
    scenarios = sorted({s.prompt.scenario or "default" for s in plain})

    def mode_figures(mode: Mode, keep) -> dict:
        chosen = [s for s in samples[mode] if keep(s)]
        base = [s for s in plain if keep(s)]
        result = figures(chosen, base)
        hf = samples.get(Mode("hf-plain"))
        if hf:
            hf_chosen = [s for s in hf if keep(s)]
            hf_tps = sum(len(s.tokens) for s in hf_chosen) / max(sum(s.wall_s for s in hf_chosen), 1e-9)
            result["speedup_vs_hf_plain"] = round(result["tokens_per_s"] / hf_tps, 3)
        result["predicted_speedup"] = None
        result["lossless"] = mode.rule.lossless
        result["accept"] = str(mode.rule)
        drafted, rounds = sum(s.drafted for s in chosen), sum(s.rounds for s in chosen)
        if mode.kind in TREE_KINDS:
            result["tree_budget"] = mode.k
        if mode.kind in TREE_KINDS or mode.kind == "auto+tree":
            result["mean_nodes"] = round(drafted / rounds, 3) if rounds else 0.0  # draft nodes verified per round
            result["tree_rounds"] = sum(s.tree_rounds for s in chosen)
        if mode.kind in AUTO_KINDS:
            # The K chosen is a ceiling: the confidence gate may draft fewer (mean_drafted).
            result["mean_k"] = round(sum(s.k_total for s in chosen) / rounds, 3) if rounds else 0.0
            result["mean_drafted"] = round(drafted / rounds, 3) if rounds else 0.0
        if mode.kind in engine_kinds() and drafted and one_token_s > 0:
            alpha = sum(s.accepted for s in chosen) / max(sum(s.judged for s in chosen), 1)
            verify_cost = sum(s.verify_s for s in chosen) / rounds / one_token_s
            draft_cost = sum(s.draft_s for s in chosen) / drafted / one_token_s
            result.update(alpha=round(alpha, 4), verify_cost=round(verify_cost, 3), draft_cost=round(draft_cost, 4))
            if mode.kind not in TREE_KINDS and mode.kind != "auto+tree":  # the rounds' model is one chain per round
                result["predicted_speedup"] = round(predicted_from_rounds(chosen, base), 3)
        return result

    return {
        "modes": {str(mode): mode_figures(mode, lambda s: True) for mode in samples},
        "scenarios": {
            scenario: {str(mode): mode_figures(mode, lambda s, sc=scenario: (s.prompt.scenario or "default") == sc)
                       for mode in samples}
            for scenario in scenarios
        },
        "lossy": {
            str(mode): {"against": str(mode.lossless_twin), "rule": str(mode.rule),
                        **lossy.compare(samples[mode], samples[mode.lossless_twin], draws, seed)}
            for mode in samples if not mode.rule.lossless
        },
    }
