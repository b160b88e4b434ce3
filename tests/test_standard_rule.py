"""The standard rule (``--accept standard``: min(1, p/q), the residual draw after a rejection): the
exact distribution of the emitted tokens on a 4-token vocabulary, integrated over the rule's uniforms
by enumeration; its acceptance Σ min(p, q); greedy unchanged; the race stays the default.

The enumeration calls the rule's own pure verdict (acceptance.lenient_verdict at L = 1) on a grid of
uniforms. The tables below are chosen so that every min(1, p(x)/q(x)) is a multiple of 1/GRID: the
verdict is then constant on each grid cell, and the midpoints integrate it exactly. A threshold off
the grid, a residual other than norm(max(0, p − q)) or a bonus row other than p's moves the result
off the target's distribution (the last test shows the classic residual bug caught).
"""

import itertools
import typing
from collections import defaultdict
from functools import cache

import pytest
import torch
from exactness import (
    PROMPT,
    RUNS,
    VOCAB,
    assert_same_distribution,
    exact_two_token_distribution,
    pair_counts,
    seeded_runs,
    small_models,
)

from specdec_cli.decoding import acceptance
from specdec_cli.decoding.acceptance import SamplingParams, greedy_accept, lenient_verdict, relaxed_accept
from specdec_cli.decoding.drafters.base import Draft, Drafter
from specdec_cli.decoding.drafters.model import ModelDrafter
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.rules import EXACT, STANDARD, AcceptRule, check_tree_rule, parse_rule
from specdec_cli.errors import UserError

V = 4
GRID = 16
# Bigram tables: row c is the distribution after token c. p is the target's, q the draft model's.
P = torch.tensor([[8, 4, 2, 2], [0, 4, 6, 6], [5, 5, 5, 1], [2, 6, 4, 4]], dtype=torch.float64) / GRID
Q = torch.tensor([[2, 2, 4, 8], [4, 4, 4, 4], [8, 8, 0, 0], [2, 2, 8, 4]], dtype=torch.float64) / GRID
LOOKUP = [1, 2, 3, 3]  # a deterministic drafter (one-hot q, passed as None): token c is followed by LOOKUP[c]
SAMPLE = SamplingParams(temperature=1.0)
STANDARD_RULE = AcceptRule(STANDARD)


def chains(last: int, k: int, lookup: bool) -> list[tuple[tuple[int, ...], float]]:
    """Every chain of k drafts after ``last`` with its probability: drawn from q, or the lookup's one."""
    found = [((), 1.0)]
    for _ in range(k):
        grown = []
        for chain, weight in found:
            before = chain[-1] if chain else last
            if lookup:
                grown.append((chain + (LOOKUP[before],), weight))
            else:
                grown += [(chain + (x,), weight * float(Q[before, x])) for x in range(V) if Q[before, x] > 0]
        found = grown
    return found


@cache
def emitted(last: int, m: int, k: int, lookup: bool) -> dict[tuple[int, ...], float]:
    """P(the next m emitted tokens) after ``last``, rounds of k drafts each, by enumeration."""
    result: dict[tuple[int, ...], float] = defaultdict(float)
    for chain, weight in chains(last, k, lookup):
        context = (last, *chain)
        p = P[list(context)]  # row i: the target after the block's i-th token
        q = None if lookup else Q[list(context[:-1])]
        for uniforms in itertools.product([(j + 0.5) / GRID for j in range(GRID)], repeat=k):
            n, after = lenient_verdict(p, q, torch.tensor(chain, dtype=torch.long), 1.0, torch.tensor(uniforms))
            assert abs(float(after.sum()) - 1) < 1e-12
            for token in range(V):
                share = weight * float(after[token]) / GRID**k
                if share == 0:
                    continue
                tokens = (*chain[:n], token)
                if len(tokens) >= m:
                    result[tokens[:m]] += share
                else:
                    for rest, more in emitted(token, m - len(tokens), k, lookup).items():
                        result[tokens + rest] += share * more
    return dict(result)


def target_distribution(last: int, m: int) -> dict[tuple[int, ...], float]:
    """P(the next m tokens) under the target alone."""
    result = {}
    for tokens in itertools.product(range(V), repeat=m):
        probability, before = 1.0, last
        for token in tokens:
            probability, before = probability * float(P[before, token]), token
        if probability > 0:
            result[tokens] = probability
    return result


def assert_same(found: dict, expected: dict) -> None:
    assert set(found) <= set(expected), f"emitted outside the target's support: {set(found) - set(expected)}"
    worst = max(abs(found.get(key, 0.0) - value) for key, value in expected.items())
    assert worst < 1e-12, f"off the target's distribution by {worst}"


@pytest.mark.parametrize("lookup", [False, True], ids=["draft model", "lookup"])
@pytest.mark.parametrize("last", range(V))
def test_the_first_token_is_distributed_exactly_as_the_target(last, lookup):
    assert_same(emitted(last, 1, 1, lookup), target_distribution(last, 1))


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("lookup", [False, True], ids=["draft model", "lookup"])
def test_the_first_two_tokens_are_distributed_exactly_as_the_target(k, lookup):
    """Across rounds: a rejection ends a round after one token, the next round drafts afresh."""
    for last in range(V):
        assert_same(emitted(last, 2, k, lookup), target_distribution(last, 2))


def expected_kept(last: int, lookup: bool) -> float:
    """E[drafts kept] of one round of one draft, by the same enumeration."""
    total = 0.0
    for (x,), weight in chains(last, 1, lookup):
        p, q = P[[last, x]], None if lookup else Q[[last]]
        for j in range(GRID):
            n, _ = lenient_verdict(p, q, torch.tensor([x]), 1.0, torch.tensor([(j + 0.5) / GRID]))
            total += weight * n / GRID
    return total


@pytest.mark.parametrize("last", range(V))
def test_a_draft_is_kept_with_probability_sum_min_p_q_and_a_lookup_draft_with_p_of_it(last):
    assert expected_kept(last, False) == pytest.approx(float(torch.minimum(P[last], Q[last]).sum()), abs=1e-12)
    assert expected_kept(last, True) == pytest.approx(float(P[last, LOOKUP[last]]), abs=1e-12)


def test_the_enumeration_catches_the_classic_residual_bug(monkeypatch):
    """Resampling a rejected position from p instead of norm(max(0, p − q)) over-weights the drafted
    tokens: the enumeration must see it (this is what makes the tests above able to fail)."""
    monkeypatch.setattr(acceptance, "residual_distribution", lambda p, q: p)
    emitted.cache_clear()
    try:
        with pytest.raises(AssertionError, match="off the target's distribution"):
            assert_same(emitted(0, 1, 1, False), target_distribution(0, 1))
    finally:
        emitted.cache_clear()


def test_the_standard_rule_is_lenient_one_under_sampling():
    """One code path: the same generator gives the same verdicts and tokens as lenient:1."""
    logits = torch.log(P[[0, 1, 2]].float())
    q = Q[[0, 1]].float()
    for seed in range(50):
        draft = torch.multinomial(q, 1, generator=torch.Generator().manual_seed(seed))[:, 0]
        standard = relaxed_accept(STANDARD_RULE, draft, q, logits, SAMPLE, torch.Generator().manual_seed(seed))
        lenient = relaxed_accept(parse_rule("lenient:1"), draft, q, logits, SAMPLE, torch.Generator().manual_seed(seed))
        assert standard == lenient


def test_under_greedy_the_standard_rule_is_the_exact_test_ties_included():
    torch.manual_seed(0)
    for wrong in [0, 1, 2, None] * 5:  # the first wrong draft, or none
        logits = torch.randn(4, 6)
        draft = logits[:3].argmax(-1)
        if wrong is not None:
            draft[wrong] = (draft[wrong] + 1) % 6
        assert relaxed_accept(STANDARD_RULE, draft, None, logits, SamplingParams()) == greedy_accept(draft, logits)
    tied = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])  # ids 0 and 1 tie: the argmax is 0, as plain decoding's
    assert relaxed_accept(STANDARD_RULE, torch.tensor([1]), None, tied, SamplingParams()) == (0, 0)
    assert relaxed_accept(parse_rule("lenient:1"), torch.tensor([1]), None, tied, SamplingParams()) == (1, 2)


def test_the_rules_names_and_what_they_promise():
    assert AcceptRule() == parse_rule("exact") and AcceptRule().kind == EXACT  # the race stays the default
    assert AcceptRule().lossless and AcceptRule().raced
    standard = parse_rule(" standard ")
    assert standard == STANDARD_RULE and str(standard) == "standard"
    assert standard.lossless and not standard.raced  # lossless in distribution; its text follows the drafts
    for lossy in ("lenient:1", "top:2", "typical:0.3,0.09"):
        assert not parse_rule(lossy).lossless and not parse_rule(lossy).raced
    with pytest.raises(UserError, match=r"^--accept 'standard:1': expected exact, standard, lenient:L"):
        parse_rule("standard:1")


def test_trees_refuse_the_standard_rule():
    check_tree_rule(AcceptRule())
    with pytest.raises(UserError, match="rule standard applies to chains of drafts; trees are verified exactly"):
        check_tree_rule(STANDARD_RULE)


def test_every_command_defaults_to_the_race_and_its_help_says_what_each_rule_gives():
    from specdec_cli.commands import bench, calibrate, common, generate, verify

    option = typing.get_args(common.AcceptOption)[1]
    assert "exact (the default)" in option.help and "standard: min(1, p/q)" in option.help
    assert "seed fixes the text only for a given drafter and K" in option.help
    for module in (bench, calibrate, generate, verify):
        defaults = [p.default for name, p in _parameters(module).items() if name == "accept"]
        assert defaults == ["exact"], module.__name__


def _parameters(module):
    import inspect

    command = next(f for f in vars(module).values() if inspect.isfunction(f) and f.__module__ == module.__name__
                   and "accept" in inspect.signature(f).parameters)
    return inspect.signature(command).parameters


# ---- Through the engine ------------------------------------------------------------------------------


class Successor(Drafter):
    """A deterministic drafter (one-hot q): each token is followed by the next id, as lookup would guess."""

    name = "successor"

    def propose(self, context, k, sampling, noise, gate=None) -> Draft:
        last = int(context[-1])
        return Draft(torch.tensor([(last + 1 + i) % VOCAB for i in range(k)], dtype=torch.long))


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["model", "successor"])
def test_the_engine_under_the_standard_rule_samples_the_targets_two_token_distribution(drafter):
    target, disagreeing = small_models()
    made = ModelDrafter(disagreeing, VOCAB) if drafter == "model" else Successor()
    runs = seeded_runs(target, made, 2, SAMPLE, RUNS, PROMPT, rule=STANDARD_RULE)
    assert_same_distribution(pair_counts(runs), exact_two_token_distribution(target, PROMPT, SAMPLE))


def _kept_and_texts(rule, n=40, tokens=8):
    target, disagreeing = small_models()
    engine = SpeculativeEngine(target, ModelDrafter(disagreeing, VOCAB), set())
    kept, texts = 0, []
    for seed in range(n):
        events = list(engine.generate(PROMPT, k=3, max_new_tokens=tokens, sampling=SAMPLE, seed=seed, rule=rule))
        kept += sum(e.accepted for e in events)
        texts.append([t for e in events for t in e.emitted])
    return kept, texts


def test_the_engine_keeps_more_drafts_under_the_standard_rule_and_its_text_is_not_the_races():
    kept_race, race = _kept_and_texts(AcceptRule())
    kept_standard, standard = _kept_and_texts(STANDARD_RULE)
    assert kept_standard > kept_race
    assert sum(a != b for a, b in zip(race, standard)) > 0


def test_the_engine_under_greedy_gives_the_same_tokens_under_both_rules():
    target, disagreeing = small_models()
    engine = SpeculativeEngine(target, ModelDrafter(disagreeing, VOCAB), set())
    for prompt in (PROMPT, [1, 2], [7, 0, 6, 5]):
        texts = {str(rule): [t for e in engine.generate(prompt, k=3, max_new_tokens=12, rule=rule) for t in e.emitted]
                 for rule in (AcceptRule(), STANDARD_RULE)}
        assert texts["exact"] == texts["standard"]
