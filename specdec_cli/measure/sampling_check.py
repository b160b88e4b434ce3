"""The sampling half of verify-equivalence: under the race (the default rule) a seed fixes the sampled
text, whatever drafts.

Sampling is drafter-invariant (decoding/coupling.py), so it is checked as greedy decoding is: N
seeds per prompt, each seed's speculative continuation at every K against the plain one under the
same seed, token for token; every seed that differs is located and classified by the race's
margin (equivalence._margin). Independently, the plain draws are tested against transformers' own
sampler on the same target (other seeds) on the first token and the first two tokens, by a
two-sample permutation test of the chi-square statistic: that checks the race's distribution is
the target's. A permutation test needs no minimum expected count, so the long tail of a real
model's distribution stays in the test instead of being pooled away.

Under a rule other than the race (``--accept standard``, a lossy one) the seed fixes no text that
plain decoding shares, so there is nothing to compare seed by seed: each K's draws are tested
against transformers' by the same permutation test instead (its seeds are not theirs, so the two
samples are independent), beside plain's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Callable, Hashable, Sequence

import numpy as np

from ..decoding.acceptance import AcceptRule, SamplingParams
from ..decoding.engine import SpeculativeEngine
from .equivalence import MISMATCH, NEAR_TIE, Decoded, Divergence, Locator, reference_decode
from ..limits import SAMPLING_PROMPTS as PROMPTS  # prompts sampled, tokens per continuation
from ..limits import SAMPLING_TOKENS as TOKENS
from ..limits import SEEDS

ALPHA = 0.01  # family-wise: split evenly over all tests (Bonferroni)
REFERENCE_SEEDS = 1_000_003  # transformers' draws use seeds from here: no draw shares a seed with the race's
STATISTICS = {"first token": 1, "first 2 tokens": 2}


def chi2_statistics(first_group: np.ndarray, totals: np.ndarray, n1: int, n: int) -> np.ndarray:
    """Chi-square of 2 × C tables with fixed margins, one per row of ``first_group`` counts."""
    expected1 = totals * (n1 / n)
    expected0 = totals - expected1
    return ((first_group - expected1) ** 2 * (1 / expected1 + 1 / expected0)).sum(axis=-1)


def permutation_test(a: Sequence[Hashable], b: Sequence[Hashable], rounds: int, seed: int = 0) -> float:
    """p-value for "a and b come from the same distribution": the share of label shufflings whose
    chi-square statistic is at least the observed one (counting the observed one, so p > 0)."""
    labels = {value: i for i, value in enumerate(dict.fromkeys([*a, *b]))}
    if len(labels) < 2:
        return 1.0  # a single outcome on both sides: nothing can differ
    codes = np.array([labels[v] for v in (*a, *b)])
    n1, n, c = len(a), len(codes), len(labels)
    totals = np.bincount(codes, minlength=c).astype(float)
    observed = chi2_statistics(np.bincount(codes[:n1], minlength=c), totals, n1, n)
    rng = np.random.default_rng(seed)
    hits, done = 0, 0
    while done < rounds:
        chunk = min(rounds - done, max(1, 2_000_000 // n))
        shuffled = rng.permuted(np.broadcast_to(codes, (chunk, n)), axis=1)[:, :n1]
        counts = np.bincount((shuffled + c * np.arange(chunk)[:, None]).ravel(), minlength=chunk * c)
        hits += int((chi2_statistics(counts.reshape(chunk, c), totals, n1, n) >= observed * (1 - 1e-12)).sum())
        done += chunk
    return (hits + 1) / (rounds + 1)


def detectable_shift(n: int, threshold: float, power: float = 0.8) -> float:
    """Roughly the smallest change in one outcome's probability that N draws per side detect with
    this power at this threshold (two-proportion z-test, worst case p = 1/2)."""
    z = NormalDist().inv_cdf
    return (z(1 - threshold / 2) + z(power)) * math.sqrt(0.5 / n)


@dataclass
class SampleTest:
    """specdec's draws (plain, or at one K) against transformers' sampler, on one prompt and one statistic."""

    prompt_id: str | int
    statistic: str
    outcomes: int  # distinct outcomes seen over both samples
    p_value: float
    draws: str = "plain"  # whose: "plain", or "K=3" where the rule is not the race


@dataclass
class SeededRuns:
    """One prompt at one K: of ``draws`` seeds, how many gave the plain run's tokens exactly."""

    prompt_id: str | int
    k: int
    draws: int
    identical: int


@dataclass
class SamplingResult:
    n: int
    temperature: float
    tests: list[SampleTest] = field(default_factory=list)
    runs: list[SeededRuns] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)  # one per differing seed, located and classified
    drafted: int = 0  # draft tokens proposed over all speculative draws: 0 would test nothing
    accepted: int = 0
    alpha: float = ALPHA
    raced: bool = True  # the rule is the race: seeds compared one by one; else every K's distribution tested

    @property
    def threshold(self) -> float:
        return self.alpha / max(1, len(self.tests))

    @property
    def rounds(self) -> int:
        """Permutations per test: enough that p can fall well below the threshold."""
        return max(9_999, math.ceil(20 / self.threshold))

    @property
    def min_p(self) -> float:
        return min((t.p_value for t in self.tests), default=1.0)

    @property
    def identical(self) -> int:
        return sum(r.identical for r in self.runs)

    @property
    def seeded(self) -> int:
        return sum(r.draws for r in self.runs)

    @property
    def same_distribution(self) -> bool:
        return self.min_p >= self.threshold

    def count(self, kind: str) -> int:
        return sum(d.kind == kind for d in self.divergences)

    @property
    def passed(self) -> bool:
        """No mismatch, and the race's draws look like transformers' (near-ties fail only under --strict)."""
        return self.count(MISMATCH) == 0 and self.same_distribution

    @property
    def sampler(self) -> str:
        """Whose draws the permutation tests judged."""
        return "plain sampling" if self.raced else "plain sampling, speculative sampling"

    def verdict(self) -> str:
        identity = (f"{self.identical}/{self.seeded} seeded speculative runs token-identical to plain sampling, "
                    f"{self.count(MISMATCH)} mismatch(es), {self.count(NEAR_TIE)} numerical near-tie(s)")
        if not self.raced:
            identity = "speculative draws tested by distribution (this rule's seed fixes no text that plain sampling shares)"
        if self.drafted == 0:  # plain against plain: the identity could not have failed
            return f"inconclusive: no draft token was proposed while sampling, so nothing speculative was tested ({identity})"
        return f"{identity}; {self.distribution_verdict()}"

    def distribution_verdict(self) -> str:
        p, threshold = f"{self.min_p:.3g}", f"{self.threshold:.3g}"
        if not self.same_distribution:
            return f"{self.sampler} and transformers' sampler differ: strong evidence (smallest p = {p} < threshold {threshold})"
        shift = detectable_shift(self.n, self.threshold)
        power = f"with {self.n} draws per side, a shift of about {shift:.0%} in one outcome's probability would be detected 80% of the time"
        if self.min_p < 0.05:
            return (f"weak evidence that {self.sampler} and transformers' sampler differ (smallest p = {p}), not "
                    f"significant at threshold {threshold}; rerun with a larger --sampling N ({power})")
        return f"no evidence that {self.sampler} and transformers' sampler differ (smallest p = {p} ≥ threshold {threshold}); {power}"

    def as_dict(self) -> dict:
        return dict(n=self.n, temperature=self.temperature, tokens=TOKENS, alpha=self.alpha,
                    compared="seed by seed" if self.raced else "by distribution",
                    threshold=self.threshold, permutations=self.rounds, min_p=self.min_p, passed=self.passed,
                    identical=self.identical, seeded=self.seeded,
                    drafted=self.drafted, accepted=self.accepted, verdict=self.verdict(),
                    runs=[asdict(r) for r in self.runs], divergences=[asdict(d) for d in self.divergences],
                    tests=[asdict(t) for t in self.tests])


def draw(engine: SpeculativeEngine, ids: list[int], k: int, n: int, first_seed: int, sampling: SamplingParams,
         rule: AcceptRule = AcceptRule()):
    """N continuations of TOKENS tokens, and the draft tokens proposed / accepted while drawing them."""
    samples, drafted, accepted = [], 0, 0
    for seed in range(first_seed, first_seed + n):
        tokens = []
        for event in engine.generate(ids, k=k, max_new_tokens=TOKENS, sampling=sampling, seed=seed, rule=rule):
            tokens += event.emitted
            drafted += len(event.drafted)
            accepted += event.accepted
        samples.append(tuple(tokens))
    return samples, drafted, accepted


def reference_draws(engine: SpeculativeEngine, ids: list[int], n: int, first_seed: int, temperature: float) -> list[tuple]:
    """N continuations of TOKENS tokens by transformers' sampler; its seeds wrap past 2⁶⁴ - 1, which torch's generator takes last."""
    return [tuple(reference_decode(engine, ids, TOKENS, temperature=temperature, seed=seed % SEEDS)[0].tokens)
            for seed in range(first_seed, first_seed + n)]


def check_sampling(
    engine: SpeculativeEngine,
    tokenizer,
    prompts: list[tuple[str | int, list[int]]],
    ks: list[int],
    n: int,
    temperature: float = 1.0,
    seed: int = 0,
    step: Callable[[str], None] = lambda _: None,
    rule: AcceptRule = AcceptRule(),
    tolerance: float = 0.0,
) -> SamplingResult:
    """Seeds ``seed`` to ``seed + n - 1`` per prompt, plainly and at every K; transformers' draws beside.
    Under the race each K's draws are compared with plain's seed by seed; else tested as plain's are."""
    sampling = SamplingParams(temperature)
    result = SamplingResult(n, temperature, raced=rule.raced)
    pending = []

    def tested(prompt_id, draws: str, ours: list[tuple], reference: list[tuple]) -> list:
        return [(SampleTest(prompt_id, name, 0, 0.0, draws), [s[:m] for s in ours], [s[:m] for s in reference])
                for name, m in STATISTICS.items()]

    for prompt_id, ids in prompts[:PROMPTS]:
        plain, _, _ = draw(engine, ids, 0, n, seed, sampling)
        reference = reference_draws(engine, ids, n, seed + REFERENCE_SEEDS, temperature)
        pending += tested(prompt_id, "plain", plain, reference)
        step(f"sampling prompt {prompt_id} plainly and with transformers")
        for k in ks:
            speculative, drafted, accepted = draw(engine, ids, k, n, seed, sampling, rule)
            result.drafted += drafted
            result.accepted += accepted
            if not rule.raced:
                pending += tested(prompt_id, f"K={k}", speculative, reference)
                step(f"sampling prompt {prompt_id} · K={k}")
                continue
            differing = [i for i in range(n) if speculative[i] != plain[i]]
            result.runs.append(SeededRuns(prompt_id, k, n, n - len(differing)))
            for i in differing:  # located on a rerun of TOKENS tokens each: cheap
                locator = Locator(engine, tokenizer, prompt_id, ids, Decoded(list(plain[i]), None), TOKENS,
                                   tolerance, rule, sampling, seed + i)
                result.divergences.append(locator.against(Decoded(list(speculative[i]), None), k))
            step(f"sampling prompt {prompt_id} · K={k}")
    result.tests = [test for test, _, _ in pending]
    rounds = result.rounds  # depends on how many tests there are
    for test, a, b in pending:
        test.outcomes = len(set(a) | set(b))
        test.p_value = permutation_test(a, b, rounds, seed)
    return result
