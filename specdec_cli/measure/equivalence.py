"""Proving that speculation changes nothing, token for token (greedy here; sampled: sampling_check.py;
the verdict over both: verdict.py).

Every prompt is decoded plainly (K = 0 through the same engine), by transformers' own ``generate``
as an independent reference, and speculatively for each K. Where two outputs differ, the first
differing position is located and the target's logits there are recomputed by a rerun with
``record_logits``: the plain run's one-token forward against the verification forward (or
transformers' forward). That tells a bug from float round-off, since forwards of different shape
(1 token vs K + 1) may order two near-equal logits differently.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from ..decoding.acceptance import AcceptRule, SamplingParams
from ..decoding.coupling import PositionNoise
from ..decoding.engine import SpeculativeEngine
from ..decoding.kv import input_device
from ..limits import NEAR_TIE_TOLERANCE
from .run_stats import RunStats

NEAR_TIE = "numerical near-tie"
MISMATCH = "mismatch"
TRANSFORMERS = "transformers"
SPECULATIVE = "speculative"

TOLERANCE = {getattr(torch, name): tolerance for name, tolerance in NEAR_TIE_TOLERANCE.items()}  # see limits.py


def default_tolerance(dtype: torch.dtype) -> float:
    return TOLERANCE.get(dtype, TOLERANCE[torch.bfloat16])


def classify(margin_plain: float | None, margin_other: float | None, tolerance: float) -> str:
    """Margins are logit[plain token] − logit[other token], once in each of the two forwards.

    A near-tie: both margins are within ``tolerance``, and each forward ranked the token it chose at
    least as high as the other one (the order flipped, or the logits are equal). Anything else means
    a token was emitted that its own forward did not rank first, or no logits exist to compare: a bug.
    """
    if margin_plain is None or margin_other is None:
        return MISMATCH
    small = abs(margin_plain) < tolerance and abs(margin_other) < tolerance
    return NEAR_TIE if small and margin_plain >= 0 >= margin_other else MISMATCH


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token; the shorter length if one is a prefix of the other."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass
class Decoded:
    tokens: list[int]
    stats: RunStats


@dataclass
class Divergence:
    """The first token where ``against`` (a speculative run, or transformers) left the plain run."""

    prompt_id: str | int
    against: str
    k: int | None  # the speculative run's K; None against transformers
    position: int  # index into the completion
    plain_token: int | None  # None: that run had already ended
    other_token: int | None
    plain_text: str
    other_text: str
    margin_plain: float | None  # logit[plain] − logit[other] in the plain run's one-token forward
    margin_other: float | None  # the same in the verification forward, or transformers' forward
    kind: str
    reproduced: bool  # the reruns gave the same tokens up to the position (False: nondeterminism)
    seed: int | None = None  # a sampled run's; margins are then the race's (_margin)


@dataclass
class Row:
    """One prompt at one K."""

    prompt_id: str | int
    k: int
    plain: RunStats
    speculative: RunStats
    identical: bool
    identical_to_transformers: bool

    def as_dict(self) -> dict:
        return dict(id=self.prompt_id, k=self.k, identical=self.identical,
                    identical_to_transformers=self.identical_to_transformers,
                    plain=self.plain.as_dict(), speculative=self.speculative.as_dict())


@dataclass
class Reference:
    """transformers' greedy ``generate`` for one prompt, against the plain run."""

    prompt_id: str | int
    stats: RunStats
    identical: bool

    def as_dict(self) -> dict:
        return dict(id=self.prompt_id, identical=self.identical, new_tokens=self.stats.new_tokens,
                    wall_s=round(self.stats.wall_s, 4))


@dataclass
class GreedyResult:
    ks: list[int]
    max_new_tokens: int
    tolerance: float
    rows: list[Row] = field(default_factory=list)
    references: list[Reference] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)

    def count(self, kind: str) -> int:
        return sum(d.kind == kind for d in self.divergences)

    def totals(self) -> dict[int, dict]:
        """Per K, summed over prompts: lengths, rounds and wall time with and without speculation."""
        totals = {}
        for k in self.ks:
            rows = [r for r in self.rows if r.k == k]
            plain_s = sum(r.plain.wall_s for r in rows)
            spec_s = sum(r.speculative.wall_s for r in rows)
            drafted = sum(r.speculative.drafted for r in rows)
            accepted = sum(r.speculative.accepted for r in rows)
            totals[k] = dict(
                prompts=len(rows), identical=sum(r.identical for r in rows),
                plain_tokens=sum(r.plain.new_tokens for r in rows),
                speculative_tokens=sum(r.speculative.new_tokens for r in rows),
                plain_rounds=sum(r.plain.rounds for r in rows),
                speculative_rounds=sum(r.speculative.rounds for r in rows),
                drafted=drafted, accepted=accepted,
                acceptance_rate=round(accepted / drafted, 4) if drafted else 0.0,
                plain_s=round(plain_s, 4), speculative_s=round(spec_s, 4),
                speedup=round(plain_s / spec_s, 3) if spec_s > 0 else None,
            )
        return totals

    def as_dict(self) -> dict:
        return dict(
            ks=self.ks, max_new_tokens=self.max_new_tokens, tolerance=self.tolerance,
            divergences=[asdict(d) for d in self.divergences],
            counts={MISMATCH: self.count(MISMATCH), NEAR_TIE: self.count(NEAR_TIE)},
            totals={str(k): v for k, v in self.totals().items()},
            transformers=[r.as_dict() for r in self.references],
            runs=[r.as_dict() for r in self.rows],
        )


def decode(engine: SpeculativeEngine, ids: list[int], k: int, max_new_tokens: int, rule: AcceptRule = AcceptRule()) -> Decoded:
    stats, tokens = RunStats(k, str(rule)), []
    for event in engine.generate(ids, k=k, max_new_tokens=max_new_tokens, rule=rule):
        stats.add(event)
        tokens += event.emitted
    return Decoded(tokens, stats.finish())


def decode_batched(engine: SpeculativeEngine, prompts: list[tuple[str | int, list[int]]], k: int, max_new_tokens: int,
                   rule: AcceptRule, batch: int, step: Callable[[str], None]) -> dict[str | int, Decoded]:
    """Every prompt decoded at K, ``batch`` at once (SpeculativeEngine.run), by prompt id."""
    requests = (engine.request(ids, k=k, max_new_tokens=max_new_tokens, rule=rule, key=(prompt_id, RunStats(k, str(rule)), []))
                for prompt_id, ids in prompts)
    found = {}
    for request, event in engine.run(requests, batch):
        prompt_id, stats, tokens = request.key
        stats.add(event)
        tokens += event.emitted
        if event.finished:
            found[prompt_id] = Decoded(tokens, stats.finish())
            step(f"prompt {prompt_id} · K={k} · batch {batch}")
    return found


def reference_decode(engine: SpeculativeEngine, ids: list[int], max_new_tokens: int, logits: bool = False,
                     temperature: float = 0.0, seed: int = 0):
    """transformers' greedy search over the same target, with the same EOS set and budget; with a
    ``temperature``, its own sampler (multinomial draws from torch's generator seeded with ``seed``),
    an implementation independent of specdec's race.

    Processors a generation_config may switch on (repetition penalty, n-gram bans) are turned off
    explicitly: the reference must be plain argmax decoding, as the engine's is. It continues from
    the engine's cache of the prompt (all tokens but the last): a quantised target computes a
    prompt on dense (bfloat16 or float32) weights (runtime/dense_prefill.py), which transformers'
    own forward does not, and what the reference checks is the decoding that follows.
    """
    model, eos = engine.target, sorted(engine.eos_token_ids)
    budget = max_new_tokens
    if engine.context_length:
        budget = min(budget, engine.context_length - len(ids))
    inputs = torch.tensor([ids], device=input_device(model))
    stats = RunStats(TRANSFORMERS)
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature else dict(do_sample=False)
    with torch.inference_mode():
        cache, _ = engine.prompt_cache(torch.tensor(ids, dtype=torch.long))
        if temperature:
            torch.manual_seed(seed)  # transformers samples from torch's global generator
        out = model.generate(
            inputs, attention_mask=torch.ones_like(inputs), cache=cache, num_beams=1, max_new_tokens=budget, **sampling,
            eos_token_id=eos or None, pad_token_id=eos[0] if eos else None, repetition_penalty=1.0,
            no_repeat_ngram_size=0, min_new_tokens=0, output_logits=logits, return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(ids):].tolist()
    stats.new_tokens = stats.rounds = len(tokens)
    stats.finish()
    return Decoded(tokens, stats), (out.logits if logits else None)


class Locator:
    """Recomputes the target's logits at a divergence, by rerunning the prompt with record_logits."""

    def __init__(self, engine, tokenizer, prompt_id, ids, plain: Decoded, max_new_tokens, tolerance, rule=AcceptRule(),
                 sampling: SamplingParams = SamplingParams(), seed: int = 0):
        self.engine, self.tokenizer, self.prompt_id, self.ids, self.rule = engine, tokenizer, prompt_id, ids, rule
        self.plain, self.max_new_tokens, self.tolerance = plain, max_new_tokens, tolerance
        self.sampling, self.seed = sampling, seed
        self._plain_rows: dict[int, tuple[torch.Tensor | None, bool]] = {}

    def against(self, other: Decoded, k: int | None) -> Divergence:
        position = first_difference(self.plain.tokens, other.tokens)
        plain_row, plain_same = self._plain_row(position)
        if k is None:
            rerun, logits = reference_decode(self.engine, self.ids, position + 1, logits=True)
            other_row, rerun_tokens = (logits[position][0] if len(logits) > position else None), rerun.tokens
        else:
            other_row, rerun_tokens = self._engine_row(k, position)
        other_same = rerun_tokens == other.tokens[: position + 1]
        a, b = _at(self.plain.tokens, position), _at(other.tokens, position)
        noise = None
        if not self.sampling.greedy:
            noise = PositionNoise(self.seed, self.engine.vocab_size, len(self.ids)).row(len(self.ids) + position)
        m_plain, m_other = (_margin(row, a, b, noise, self.sampling.temperature) for row in (plain_row, other_row))
        return Divergence(
            self.prompt_id, TRANSFORMERS if k is None else SPECULATIVE, k, position, a, b,
            self._text(a), self._text(b), m_plain, m_other, classify(m_plain, m_other, self.tolerance),
            plain_same and other_same, None if self.sampling.greedy else self.seed,
        )

    def _plain_row(self, position: int):
        if position not in self._plain_rows:
            row, tokens = self._engine_row(0, position)
            self._plain_rows[position] = (row, tokens == self.plain.tokens[: position + 1])
        return self._plain_rows[position]

    def _engine_row(self, k: int, position: int):
        """The target's logits row scoring ``position``, and the tokens the rerun emitted up to it."""
        tokens, rows = [], []
        for event in self.engine.generate(self.ids, k=k, max_new_tokens=self.max_new_tokens, record_logits=True, rule=self.rule,
                                          sampling=self.sampling, seed=self.seed):
            tokens += event.emitted
            rows.append(event.logits)
            if len(tokens) > position:
                return torch.cat(rows)[position], tokens[: position + 1]
        return None, tokens

    def _text(self, token: int | None) -> str:
        return "(ended)" if token is None else self.tokenizer.decode([token])


def _at(tokens: list[int], i: int) -> int | None:
    return tokens[i] if i < len(tokens) else None


def _margin(row: torch.Tensor | None, a: int | None, b: int | None, noise: torch.Tensor | None = None,
            temperature: float = 1.0) -> float | None:
    """logit[a] − logit[b]; under sampling the same for the race's scores, in logit units: the two
    ids' log(p / E) differ by (logit[a] − logit[b]) / T − (log E[a] − log E[b]), times T."""
    if row is None or a is None or b is None:
        return None
    margin = float(row[a].double() - row[b].double())
    if noise is not None:
        margin -= temperature * float(noise[a].double().log() - noise[b].double().log())
    return margin


def check_greedy(
    engine: SpeculativeEngine,
    tokenizer,
    prompts: list[tuple[str | int, list[int]]],
    ks: list[int],
    max_new_tokens: int,
    tolerance: float,
    step: Callable[[str], None] = lambda _: None,
    rule: AcceptRule = AcceptRule(),
    batch: int = 1,
) -> GreedyResult:
    """Decode every prompt plainly, with transformers, and at every K (``batch`` prompts at once: each
    must still be its own plain decoding); locate each divergence.

    Under a lossy ``rule`` the speculative runs use it, and their divergences are what it costs."""
    result = GreedyResult(list(ks), max_new_tokens, tolerance)
    batched = {k: decode_batched(engine, prompts, k, max_new_tokens, rule, batch, step) for k in ks} if batch > 1 else {}
    for prompt_id, ids in prompts:
        plain = decode(engine, ids, 0, max_new_tokens)
        reference, _ = reference_decode(engine, ids, max_new_tokens)
        locator = Locator(engine, tokenizer, prompt_id, ids, plain, max_new_tokens, tolerance, rule)
        result.references.append(Reference(prompt_id, reference.stats, reference.tokens == plain.tokens))
        if reference.tokens != plain.tokens:
            result.divergences.append(locator.against(reference, None))
        for k in ks:
            speculative = batched[k][prompt_id] if batched else decode(engine, ids, k, max_new_tokens, rule)
            if speculative.tokens != plain.tokens:
                result.divergences.append(locator.against(speculative, k))
            result.rows.append(Row(prompt_id, k, plain.stats, speculative.stats,
                                   speculative.tokens == plain.tokens, speculative.tokens == reference.tokens))
            if not batched:
                step(f"prompt {prompt_id} · K={k}")
    return result
