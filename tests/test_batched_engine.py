"""Batched decoding (SpeculativeEngine.run with a batch above 1): every answer's tokens are the ones
it gets alone at K 0, for every drafter, chains and trees, greedy and sampled; answers that finish
mid-batch free their place for the next; a target without the lean forward is refused a batch."""

import pytest
import torch
from conftest import tiny_llama

from specdec_cli.decoding.acceptance import SamplingParams
from specdec_cli.decoding.control.adaptive import AdaptiveK
from specdec_cli.decoding.control.priors import Prior
from specdec_cli.decoding.drafters.beside import Beside
from specdec_cli.decoding.drafters.head import HeadDrafter, HeadTree
from specdec_cli.decoding.drafters.lookup import LookupFirst, NgramDrafter
from specdec_cli.decoding.drafters.model import ModelDrafter
from specdec_cli.decoding.drafters.recycle import RecycleDrafter
from specdec_cli.decoding.drafters.suffix import SuffixDrafter
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.head_network import DraftHead, head_config
from specdec_cli.errors import UserError
from specdec_cli.runtime.lean_install import use_lean_forward
from specdec_cli.runtime.quantize import quantise_model
from specdec_cli.runtime.rowwise_attention import use_rowwise_attention

pytestmark = pytest.mark.cpu_kernels  # run again on AVX2's kernels (test_cpu_paths.py)

EOS = {1}


@pytest.fixture(scope="module")
def target():
    model = quantise_model(tiny_llama(seed=21, hidden=64, layers=2), "int8")
    use_rowwise_attention(model)
    assert use_lean_forward(model)
    return model


def prompts():
    """Ragged prompts: a one-token one, short ones, repeating ones (lookup drafts), and ones past the
    64 rows a verify block may have (cached as prompts, in one causal call)."""
    g = torch.Generator().manual_seed(3)
    loop = [5, 6, 7, 8, 9] * 16
    return [[4], [0, 5, 6, 7, 8, 5, 6, 7], loop[:70], torch.randint(2, 98, (12,), generator=g).tolist(),
            loop[:23], torch.randint(2, 98, (90,), generator=g).tolist(), [7, 7, 7, 7], loop[3:40]]


def budgets():
    return [24, 10, 30, 7, 20, 14, 26, 17]  # answers end at different rounds: places free mid-batch


def drafters(target):
    head = lambda: HeadDrafter(DraftHead(head_config(target)), target)  # noqa: E731
    draft_model = quantise_model(tiny_llama(seed=22, hidden=32, layers=1), "int8")
    return {
        "ngram": NgramDrafter(),
        "model": ModelDrafter(draft_model, 98),
        "head": head(),
        "lookup+head": LookupFirst(head()),
        "beside": Beside(NgramDrafter(), (RecycleDrafter(98), SuffixDrafter(vocab_limit=98))),
        "tree": HeadTree(head(), width=2, depth=3),
    }


def alone(target, ids, budget, sampling, seed):
    engine = SpeculativeEngine(target, None, EOS)
    return [t for e in engine.generate(ids, k=0, max_new_tokens=budget, sampling=sampling, seed=seed) for t in e.emitted]


def batched(engine, k, batch, sampling, seeds, schedule=None):
    requests = (engine.request(ids, k=schedule() if schedule else k, max_new_tokens=n, sampling=sampling, seed=s, key=i)
                for i, (ids, n, s) in enumerate(zip(prompts(), budgets(), seeds)))
    answers, widths = {}, []
    for request, event in engine.run(requests, batch):
        answers.setdefault(request.key, []).extend(event.emitted)
        widths.append(event.batch)
    return [answers.get(i, []) for i in range(len(prompts()))], widths


@pytest.mark.parametrize("name", ["ngram", "model", "head", "lookup+head", "beside", "tree"])
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, top_k=20)], ids=["greedy", "sampled"])
def test_every_batched_answer_is_its_own_plain_decoding(target, name, sampling):
    seeds = [11 * i for i in range(len(prompts()))]
    expected = [alone(target, ids, n, sampling, s) for ids, n, s in zip(prompts(), budgets(), seeds)]
    engine = SpeculativeEngine(target, drafters(target)[name], EOS)
    k = 5 if name == "tree" else 3
    got, widths = batched(engine, k, 3, sampling, seeds)
    assert got == expected
    assert max(widths) == 3  # rounds shared a forward


def test_an_adaptive_schedule_per_answer_and_a_batch_larger_than_the_prompts(target):
    engine = SpeculativeEngine(target, LookupFirst(HeadDrafter(DraftHead(head_config(target)), target)), EOS)
    seeds = [0] * len(prompts())
    schedule = lambda: AdaptiveK(Prior(3, 0.6, 0.05))  # noqa: E731
    got, widths = batched(engine, None, 16, SamplingParams(), seeds, schedule)
    assert got == [alone(target, ids, n, SamplingParams(), 0) for ids, n in zip(prompts(), budgets())]
    assert max(widths) == len(prompts())


class Priced:
    """Step costs as known: a step of one row an answer takes a second, a draft row ``row`` seconds more."""

    def __init__(self, row: float):
        self.row, self.observed = row, 0

    def observe(self, blocks, seconds):
        self.observed += 1

    def known(self):
        return True

    def seconds(self, blocks):
        return 1.0

    def row_s(self, past):
        return self.row


@pytest.mark.parametrize("row_s, drafts", [(0.0, True), (10.0, False)], ids=["rows-cheap", "rows-dear"])
def test_a_batch_drafts_where_its_step_costs_say_a_row_pays_and_nowhere_else(target, row_s, drafts):
    engine = SpeculativeEngine(target, NgramDrafter(), EOS)
    engine.step_costs = Priced(row_s)
    schedule = lambda: AdaptiveK(Prior(3, 0.6, 0.05))  # noqa: E731
    requests = (engine.request(ids, k=schedule(), max_new_tokens=n, key=i) for i, (ids, n) in enumerate(zip(prompts(), budgets())))
    shared, answers = [], {}
    for request, event in engine.run(requests, 4):
        answers.setdefault(request.key, []).extend(event.emitted)
        if event.batch > 1:
            shared.append(len(event.drafted))
    assert [answers[i] for i in range(len(prompts()))] == [alone(target, ids, n, SamplingParams(), 0)
                                                          for ids, n in zip(prompts(), budgets())]
    assert shared and (sum(shared) > 0) == drafts  # a round alone in its forward drafts as planned either way
    assert engine.step_costs.observed > 0  # the batch's forwards of rounds alone are shown to the costs


def test_a_target_on_transformers_forward_is_refused_a_batch_and_runs_one_at_a_time():
    model = tiny_llama(seed=21)
    engine = SpeculativeEngine(model, NgramDrafter(), EOS)
    requests = [engine.request([3, 4, 5], k=2, max_new_tokens=4)]
    with pytest.raises(UserError, match="needs specdec's lean forward"):
        list(engine.run(requests, 2))
    assert len([t for _, e in engine.run(requests, 1) for t in e.emitted]) == 4
