"""The free drafters that learn as they run: token recycling (recycle.py) and the suffix memory
(suffix.py): their tables, their bound, exact token identity with plain decoding, exact sampled
distributions, and how a schedule weighing drafters sees them."""

from types import SimpleNamespace

import pytest
import torch
from conftest import PROMPT, decode
from exactness import assert_lossless, small_models

from specdec_cli.decoding import engine
from specdec_cli.decoding.acceptance import SamplingParams
from specdec_cli.decoding.control.adaptive import AdaptiveK
from specdec_cli.decoding.control.priors import Prior
from specdec_cli.decoding.drafters.base import Draft, Drafter, Needs, Verified, top_ids
from specdec_cli.decoding.drafters.beside import Beside
from specdec_cli.decoding.drafters.lookup import NgramDrafter
from specdec_cli.decoding.drafters.recycle import RecycleDrafter, walk
from specdec_cli.decoding.drafters.suffix import MAX_MATCH, SuffixDrafter, continuation, count


def test_recycling_walks_the_first_successors_and_stops_at_a_token_never_verified():
    drafter = RecycleDrafter(vocab_size=10)
    drafter.observe(Verified(torch.tensor([1, 2]), 1, block=torch.tensor([2, 5, 7]),
                             successors=torch.tensor([[5], [7], [2]])))
    assert walk(drafter.table, 2, 5) == [5, 7, 2, 5, 7]
    assert drafter.propose(torch.tensor([9, 5]), 3, None, None).tokens.tolist() == [7, 2, 5]
    assert len(drafter.propose(torch.tensor([3]), 3, None, None)) == 0  # 3 was never verified
    drafter.observe(Verified(torch.tensor([1]), 1, block=torch.tensor([7]), successors=torch.tensor([[4]])))
    assert walk(drafter.table, 2, 4) == [5, 7, 4]  # the latest row replaces the old one; 4 never verified


def test_a_recycled_draft_is_tagged_by_how_often_in_a_row_the_target_chose_its_first_token():
    drafter = RecycleDrafter(vocab_size=10)

    def seen(successor):
        drafter.observe(Verified(torch.tensor([2]), 1, block=torch.tensor([2]), successors=torch.tensor([[successor]])))
        return drafter.propose(torch.tensor([2]), 1, None, None).source

    assert [seen(5), seen(5), seen(5), seen(5), seen(6), seen(6)] == \
        ["recycle-1", "recycle-2", "recycle", "recycle", "recycle-1", "recycle-2"]


def test_top_ids_are_the_best_first():
    logits = torch.tensor([[0.1, 3.0, 2.0, -1.0], [5.0, 0.0, 0.0, 6.0]])
    assert top_ids(logits, 1).tolist() == [[1], [3]]
    assert top_ids(logits, 2).tolist() == [[1, 2], [3, 0]]


def remembered(*answers, lead=0):
    drafter = SuffixDrafter()
    for answer in answers:
        drafter.remember(list(answer), lead)
    return drafter


def test_the_suffix_memory_drafts_the_most_frequent_continuation_as_far_as_the_match_is_long():
    drafter = remembered([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9], [1, 2, 3, 4, 5, 6])
    assert continuation(drafter.counts, [7, 3, 4], 8) == ([5, 6], 2)  # 5 followed "3 4" twice, 9 once
    assert continuation(drafter.counts, [1, 2], 8)[0] == [3, 4]  # a match of two drafts two
    assert continuation(drafter.counts, [1, 2, 3, 4], 1)[0] == [5]  # never past k
    assert continuation(drafter.counts, [8, 8], 8)[0] == []  # nothing remembered there
    assert continuation(drafter.counts, [3], 8)[0] == []  # one token is too weak a match
    assert [drafter.propose(torch.tensor(tail), 8, None, None).source for tail in ([7, 3, 4], [2, 3, 4], [1, 2, 3, 4])] \
        == ["suffix-2", "suffix-3", "suffix"]  # tagged by the match's length


def test_the_suffix_memory_stops_where_the_drafts_estimated_chance_falls_below_a_tenth():
    answers = [[1, 2, 3, 10 + i] for i in range(11)]  # after "2 3", eleven different tokens
    assert continuation(remembered(*answers).counts, [1, 2, 3], 8)[0] == []
    assert continuation(remembered(*answers[:9]).counts, [1, 2, 3], 8)[0] == [10]  # 1/9 ≥ 0.1


def test_an_answers_lead_lets_its_first_tokens_be_drafted_but_is_not_itself_remembered():
    drafter = remembered([90, 91, 1, 2, 3], lead=2)
    assert continuation(drafter.counts, [90, 91], 8)[0] == [1, 2]
    assert continuation(drafter.counts, [89, 90], 8)[0] == []  # the lead's own successors are not counted


def test_the_memory_forgets_the_oldest_answers_past_its_bound_exactly():
    drafter = SuffixDrafter(memory_tokens=10)
    for answer in ([1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 3, 9]):
        drafter.remember(answer)
    assert drafter.size == 8 and [a for a, _ in drafter.answers] == [[5, 6, 7, 8], [1, 2, 3, 9]]
    fresh: dict = {}
    for answer in ([5, 6, 7, 8], [1, 2, 3, 9]):
        count(fresh, answer, 0, 1)
    assert drafter.counts == fresh  # nothing of the forgotten answer is left, not even zero counts


def test_the_suffix_memory_learns_a_finished_answer_with_the_prompts_tail_leading_into_it():
    drafter = SuffixDrafter()
    context = torch.arange(20, 20 + MAX_MATCH + 4)  # a prompt of MAX_MATCH + 2 tokens, then its answer
    drafter.observe(Verified(context, MAX_MATCH + 2))  # not finished: nothing remembered
    assert drafter.size == 0
    drafter.observe(Verified(context, MAX_MATCH + 2, finished=True))
    assert drafter.size == MAX_MATCH + 2 and drafter.answers[0][1] == MAX_MATCH


@pytest.mark.parametrize("make", [lambda t: RecycleDrafter(t.config.vocab_size), lambda t: SuffixDrafter()],
                         ids=["recycle", "suffix"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_a_free_drafter_alone_equals_plain_decoding_token_for_token(target, plain, make, k):
    drafter = make(target)
    decode(target, drafter, k)  # one answer first: the suffix memory and the table have something to draft from
    tokens, events = decode(target, drafter, k)
    assert tokens == plain
    assert sum(e.accepted for e in events) > 0  # it drafted, and the target kept some of it


def ticking_clock(monkeypatch) -> None:
    """The engine's clock ticks once a reading: a schedule weighs the same seconds on a busy machine
    as on an idle one (a stall of 40 ms in a first round once made it drop a drafter for the prompt)."""
    ticks = iter(range(10**6))
    monkeypatch.setattr(engine, "time", SimpleNamespace(perf_counter=lambda: next(ticks) * 1e-3))


def test_beside_the_pairs_drafter_auto_weighs_the_free_drafters_and_stays_exact(target, plain, monkeypatch):
    ticking_clock(monkeypatch)
    drafter = Beside(NgramDrafter(), (RecycleDrafter(target.config.vocab_size), SuffixDrafter()))
    assert [d.name for d in drafter.parts()[0]] == ["ngram", "recycle", "suffix"] and drafter.parts()[1] is None
    schedule = AdaptiveK(Prior(3, 0.5, 0.0), main="lookup")
    for _ in range(3):
        tokens, events = decode(target, drafter, schedule)
        assert tokens == plain
        schedule.begin()
    kinds = {name.split("-")[0] for name in schedule.standings}
    assert {"recycle", "suffix"} <= kinds  # offered and weighed
    assert {e.source.split("-")[0] for e in events} & {"recycle", "suffix"}


def test_a_fixed_k_drafts_with_the_main_drafter_alone():
    class Counting(Drafter):
        name, free = "counting", True

        def __init__(self):
            self.asked = 0

        def propose(self, context, k, sampling, generator, gate=None):
            self.asked += 1
            return Draft.empty()

    beside = Counting()
    target = small_models()[0]
    decode(target, Beside(NgramDrafter(), (beside,)), 3, prompt=[3, 4, 5], max_new_tokens=6)
    assert beside.asked == 0


def test_a_drafter_added_in_one_module_is_offered_observed_and_kept_exact(target, plain, monkeypatch):
    """The interface: a new free drafter needs no change to the engine or the schedule."""

    class Oracle(Drafter):
        """Knows the answer: drafts plain decoding's next tokens, and counts what it is shown."""

        name, free = "oracle", True
        needs = Needs(successors=2)

        def __init__(self):
            self.seen: list[Verified] = []

        def observe(self, verified):
            self.seen.append(verified)

        def propose(self, context, k, sampling, generator, gate=None):
            at = context.shape[0] - len(PROMPT)
            return Draft(torch.tensor(plain[at : at + k], dtype=torch.long), source=self.name)

    ticking_clock(monkeypatch)
    oracle = Oracle()
    schedule = AdaptiveK(Prior(3, 0.5, 0.0), main="lookup")
    tokens, events = decode(target, Beside(NgramDrafter(), (oracle,)), schedule)
    assert tokens == plain and sum(e.source == "oracle" for e in events) >= len(events) // 2
    assert len(oracle.seen) == len(events) + 1  # the prompt, then every round
    assert all(v.successors.shape == (len(v.block), 2) for v in oracle.seen[1:])
    assert oracle.seen[-1].finished and not any(v.finished for v in oracle.seen[:-1])
    assert oracle.seen[-1].context[len(PROMPT) :].tolist() == plain


@pytest.mark.parametrize("make", [lambda t: RecycleDrafter(t.config.vocab_size), lambda t: SuffixDrafter()],
                         ids=["recycle", "suffix"])
def test_a_free_drafter_samples_exactly_the_targets_distribution(make):
    target, _ = small_models()
    drafter = make(target)
    if isinstance(drafter, SuffixDrafter):
        for first in range(8):  # every continuation remembered once, so that it drafts after any pair
            drafter.remember([3, 4, 5, first, first, 5], lead=3)
    else:
        drafter.table[:, 0] = torch.arange(8, dtype=torch.int32).roll(1)  # each token's successor known
    assert_lossless(target, drafter, SamplingParams(1.0), k=2)


def test_each_line_of_the_free_kinds_table_names_a_drafter_everywhere(pair_dir, tmp_path, cache):
    """One line in free_kinds.py is a drafter models.yaml, --drafter and the bench all know, built as
    the kind it says it is."""
    from specdec_cli.commands.common import DrafterOption
    from specdec_cli.pairs.free_kinds import FREE_KINDS
    from specdec_cli.decoding.loaded_pair import free_drafter
    from specdec_cli.measure.loop_bench import parse_modes
    from specdec_cli.measure.mode_kinds import drafter_of, engine_kinds
    from specdec_cli.pairs.registry import draft_keys, parse_drafter

    help_text = DrafterOption.__metadata__[0].help
    answers = tmp_path / "answers.jsonl"
    answers.write_text('{"ids": [5, 6, 7, 8], "start": 1}\n')
    for name, kind in FREE_KINDS.items():
        mapping = {"kind": name, "source": str(answers)} if kind.needs_source else {"kind": name}
        assert parse_drafter(mapping).kind == name and (kind.needs_source or parse_drafter(name).kind == name)
        assert set(kind.keys) < set(draft_keys(name))
        assert name in engine_kinds() and drafter_of(name) == name
        assert (name, 3) in [(m.kind, m.k) for m in parse_modes(f"{name}:3")]
        assert f"'{name}' ({kind.what}" in help_text
        drafter = free_drafter(parse_drafter(mapping), 98)
        assert drafter.name == name and drafter.free
        assert len(drafter.propose(torch.tensor(PROMPT), 3, None, None)) <= 3


@pytest.mark.parametrize("kind", ["recycle", "suffix"])
def test_export_refuses_a_free_drafter_the_engine_has_no_method_for(pair_dir, tmp_path, kind):
    """Before, a recycle or suffix pair was exported as prompt lookup without a word."""
    from typer.testing import CliRunner

    from conftest import one_line_error
    from specdec_cli.cli import app

    models = tmp_path / "models.yaml"
    models.write_text(f"default: p\npairs:\n  p:\n    target: {pair_dir / 'target'}\n    draft: {kind}\n")
    bench = tmp_path / "bench.json"
    bench.write_text('{"levels": [1], "modes": {"vllm-plain": {"1": {"output_tok_s": 20.0}}, '
                     '"vllm-ngram:4": {"1": {"output_tok_s": 35.0}}}}')
    result = CliRunner().invoke(app, ["export", "--engine", "vllm", "--models", str(models), "--from-bench", str(bench)])
    text = {"recycle": "recycle (token recycling: the target's own earlier predictions)",
            "suffix": "suffix (memory of earlier answers)"}[kind]
    assert one_line_error(result) == (f"pair p drafts with {text}, which vllm has no speculative method for: "
                                      "export its ngram, model or head drafter (--drafter KIND)")
