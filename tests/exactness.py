"""The exact-distribution test for speculative sampling, shared by every drafter's tests.

Sampling is drafter-invariant (decoding/coupling.py): under one seed a speculative run must equal
plain decoding token for token, so a drafter's check is IDENTITY_RUNS seeded runs held to plain's.
Plain decoding's own distribution does not depend on any drafter, so it is checked once per sampling
setting (test_exactness.py): with a target of a few tokens' vocabulary, P(a, b | prompt) is
enumerated exactly and RUNS seeded plain runs must match it under a chi-square test at P_VALUE.
Together: every speculative run is a plain run, and plain runs have the target's distribution.

IDENTITY_RUNS: a bug that changes a round's text in a share ε of the runs passes all of them with
probability (1 − ε)^400, 3e-4 at ε = 0.02; an acceptance bug (a draft kept that is not the target's
token, a wrong token after a refusal) changes far more. RUNS is sized by power: the chi-square must
catch a sampler whose first token is off by a total variation of 0.11 (the classic bug of the older
rule, which resampled a rejected draft from p instead of max(0, p - q)). At RUNS it misses that with
probability ``missed_rate`` < 1e-3 (noncentral chi-square; test_exactness.py holds it), and fails a
correct sampler with probability P_VALUE (each check is seeded, so a given one passes or fails for good).
"""

import torch
from conftest import tiny_llama
from scipy.stats import chi2, chisquare, ncx2

from specdec_cli.decoding.acceptance import distribution
from specdec_cli.decoding.engine import SpeculativeEngine

VOCAB = 8
PROMPT = [3, 4, 5]
RUNS = 2000  # seeded plain runs per distribution check: see the module's docstring
IDENTITY_RUNS = 400  # seeded speculative runs held to plain's text, per check
P_VALUE = 1e-3  # below it, the sampled counts are not the target's distribution


def small_models():
    """A small-vocabulary target with a spread-out distribution, and a draft that disagrees with it."""
    target = tiny_llama(seed=11, vocab_size=VOCAB, hidden=16, layers=1)
    with torch.no_grad():
        target.lm_head.weight.mul_(0.25)  # a spread-out distribution: every continuation occurs
    disagreeing = tiny_llama(seed=11, vocab_size=VOCAB, hidden=16, layers=1)
    with torch.no_grad():
        disagreeing.lm_head.weight.mul_(-0.5)  # prefers what the target avoids
    return target, disagreeing


def exact_two_token_distribution(target, prompt, sampling):
    """P(a, b | prompt) for every pair, by enumeration with the target alone."""
    with torch.no_grad():
        first = distribution(target(torch.tensor([prompt])).logits[0, -1], sampling)
        rows = torch.tensor([prompt + [a] for a in range(VOCAB)])
        second = distribution(target(rows).logits[:, -1], sampling)
    return (first[:, None] * second).flatten()


def seeded_runs(target, drafter, k, sampling, n, prompt, drafted=None, tokens=2, **options) -> list[tuple[int, ...]]:
    """The ``tokens`` tokens of each of ``n`` runs, seeds 0 to n - 1; ``drafted`` (a list), when
    given, collects how many tokens each run drafted."""
    engine = SpeculativeEngine(target, drafter, set())
    runs = []
    for seed in range(n):
        events = list(engine.generate(prompt, k=k, max_new_tokens=tokens, sampling=sampling, seed=seed, **options))
        runs.append(tuple(t for e in events for t in e.emitted))
        if drafted is not None:
            drafted.append(sum(len(e.drafted) for e in events))
    return runs


def assert_same_as_plain(target, drafter, k, sampling, prompt=PROMPT, tokens=2, **options) -> int:
    """IDENTITY_RUNS seeded speculative runs each equal plain decoding's under its seed; the number
    of tokens they drafted."""
    drafted: list[int] = []
    runs = seeded_runs(target, drafter, k, sampling, IDENTITY_RUNS, prompt, drafted, tokens, **options)
    plain = seeded_runs(target, None, 0, sampling, IDENTITY_RUNS, prompt, tokens=tokens)
    differing = [seed for seed, (a, b) in enumerate(zip(runs, plain)) if a != b]
    assert not differing, f"{len(differing)} of {len(runs)} seeds gave other text than plain decoding, first seed {differing[0]}"
    return sum(drafted)


def assert_lossless(target, drafter, sampling, k=2, prompt=PROMPT, **options):
    """Speculative sampling with ``drafter`` is plain decoding's, seed by seed (whose distribution
    test_exactness.py checks), and the drafter did draft (one that never drafts would pass as plain)."""
    drafted = assert_same_as_plain(target, drafter, k, sampling, prompt, **options)
    assert drafted > 0, "the drafter drafted nothing: this run tested plain decoding"


def pair_counts(runs) -> torch.Tensor:
    """How often each two-token continuation occurred."""
    counts = torch.zeros(VOCAB * VOCAB)
    for first, second, *_ in runs:
        counts[first * VOCAB + second] += 1
    return counts


def pooled(values, probs, n: int) -> torch.Tensor:
    """``values`` per cell of the target's support, the cells the target expects fewer than 5 of in
    ``n`` runs summed into one (as the chi-square test needs)."""
    values, probs = values[probs > 0], probs[probs > 0]
    keep = probs / probs.sum() * n >= 5
    rare = values[~keep].sum()[None] if (~keep).any() else values[:0]
    return torch.cat([values[keep], rare])


def assert_same_distribution(counts, probs):
    counts, probs = counts.double(), probs.double()
    assert counts[probs == 0].sum() == 0  # nothing outside the target's support (top-k, top-p)
    n = float(counts.sum())
    observed, expected = pooled(counts, probs, n), pooled(probs / probs[probs > 0].sum() * n, probs, n)
    assert len(observed) >= 10
    assert chisquare(observed.tolist(), expected.tolist()).pvalue > P_VALUE


def missed_rate(probs, wrong, n: int = RUNS) -> float:
    """The chance that the check at ``n`` runs passes a sampler whose distribution is ``wrong``, not
    ``probs``: the noncentral chi-square with λ = n Σ (wrong - p)² / p stays under the critical value."""
    probs, wrong = probs.double() / probs.sum(), wrong.double() / wrong.sum()
    p, w = pooled(probs, probs, n), pooled(wrong, probs, n)
    df = len(p) - 1
    return float(ncx2.cdf(chi2.isf(P_VALUE, df), df, n * float(((w - p) ** 2 / p).sum())))
