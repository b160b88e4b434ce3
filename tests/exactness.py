"""The exact-distribution test for speculative sampling, shared by every drafter's tests.

With a target of a few tokens' vocabulary, P(a, b | prompt) is enumerated exactly; thousands of
seeded two-token speculative runs must then match it under a chi-square test.
"""

import torch
from conftest import tiny_llama
from scipy.stats import chisquare

from specdec_cli.decoding.acceptance import distribution
from specdec_cli.decoding.engine import SpeculativeEngine

VOCAB = 8
PROMPT = [3, 4, 5]


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


def sampled_pairs(target, drafter, k, sampling, n=3000, prompt=PROMPT, drafted=None):
    """Counts of each two-token continuation over ``n`` seeded runs; ``drafted`` (a list), when
    given, collects how many tokens each run drafted."""
    counts = torch.zeros(VOCAB * VOCAB)
    engine = SpeculativeEngine(target, drafter, set())
    for seed in range(n):
        events = list(engine.generate(prompt, k=k, max_new_tokens=2, sampling=sampling, seed=seed))
        tokens = [t for e in events for t in e.emitted]
        counts[tokens[0] * VOCAB + tokens[1]] += 1
        if drafted is not None:
            drafted.append(sum(len(e.drafted) for e in events))
    return counts


def assert_same_distribution(counts, probs):
    counts, probs = counts.double(), probs.double()
    assert counts[probs == 0].sum() == 0  # nothing outside the target's support (top-k, top-p)
    counts, probs = counts[probs > 0], probs[probs > 0]
    expected = probs / probs.sum() * counts.sum()
    keep = expected >= 5  # pool the rare cells, as the chi-square test needs
    observed, expected = counts[keep].tolist(), expected[keep].tolist()
    if (~keep).any():
        observed.append(float(counts[~keep].sum()))
        expected.append(float(probs[~keep].sum() / probs.sum() * counts.sum()))
    assert len(observed) >= 10
    assert chisquare(observed, expected).pvalue > 1e-3


def assert_lossless(target, drafter, sampling, k=2, n=3000, prompt=PROMPT):
    """Speculative sampling with ``drafter`` gives exactly the target's two-token distribution, and
    the drafter did draft (a drafter that never drafts would pass as plain decoding)."""
    drafted: list[int] = []
    counts = sampled_pairs(target, drafter, k, sampling, n, prompt, drafted)
    assert sum(drafted) > 0, "the drafter drafted nothing: this run tested plain decoding"
    assert_same_distribution(counts, exact_two_token_distribution(target, prompt, sampling))
