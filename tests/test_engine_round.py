"""One round for chains and trees: a chain is a tree with one child per node, kept on the chain's
causal forward; the engine reads its drafter's and schedule's capabilities from their declared
interface (drafters.Drafter, schedule.KSchedule), never by probing for attributes."""

import ast
from pathlib import Path

import pytest
from conftest import PROMPT

from specdec_cli.decoding import engine as engine_module
from specdec_cli.decoding.acceptance import SamplingParams
from specdec_cli.decoding.drafters.base import Draft, Drafter, Needs, TreeDrafting, TreesOnly, drafts_trees
from specdec_cli.decoding.drafters.beside import Beside
from specdec_cli.decoding.drafters.lookup import LookupFirst
from specdec_cli.decoding.drafters.model import ModelDrafter
from specdec_cli.decoding.engine import FixedK, KSchedule, SpeculativeEngine
from specdec_cli.decoding.schedule import Plan, Take



class AsTree(Drafter):
    """A chain drafter's drafts handed over as trees of width one: node i + 1 the only child of node i."""

    def __init__(self, chain: Drafter):
        self.chain, self.name = chain, chain.name

    def reset(self):
        self.chain.reset()

    def propose(self, context, k, sampling, generator, gate=None):
        draft = self.chain.propose(context, k, sampling, generator)
        return Draft(draft.tokens, parents=tuple(range(len(draft))), source=draft.source)


def spied(monkeypatch, target):
    """Record whether each target forward got an attention mask (a tree's) or ran causally (a chain's)."""
    masks = []
    forward = target.forward

    def spy(*args, **kwargs):
        masks.append(kwargs.get("attention_mask") is not None)
        return forward(*args, **kwargs)

    monkeypatch.setattr(target, "forward", spy)
    return masks


@pytest.mark.parametrize("k", [1, 3, 6])
def test_a_chain_as_a_tree_of_width_one_keeps_the_chains_tokens_and_acceptance(target, similar, monkeypatch, k):
    def run(drafter):
        events = list(SpeculativeEngine(target, drafter, {1}).generate(PROMPT, k=k, max_new_tokens=30))
        return [t for e in events for t in e.emitted], [(e.drafted, e.accepted, e.token) for e in events], events

    plain, _, _ = run(None)
    masks = spied(monkeypatch, target)
    chain_tokens, chain_rounds, chain_events = run(ModelDrafter(similar, target.config.vocab_size))
    chain_masks, masks[:] = masks[:], []
    tree_tokens, tree_rounds, tree_events = run(AsTree(ModelDrafter(similar, target.config.vocab_size)))
    assert chain_tokens == tree_tokens == plain
    assert chain_rounds == tree_rounds and (k == 1 or any(a < len(d) for d, a, _ in chain_rounds))  # rejections too
    assert not any(chain_masks)  # a chain is verified causally: the kernels of one-token forwards
    # the same drafts as trees: each under its ancestor mask (the prompt's forward first, causal)
    assert masks[1:] == [e.parents is not None for e in tree_events] and sum(masks) > len(tree_events) // 2
    assert all(e.parents is None and e.path is None and e.turned_down is None for e in chain_events)
    assert all(e.path == list(range(1, e.accepted + 1)) for e in tree_events if e.drafted)
    assert [e.judged for e in chain_events] == [e.judged for e in tree_events]


def test_the_engine_probes_no_attribute_of_its_drafter_or_schedule():
    tree = ast.parse(Path(engine_module.__file__).read_text())
    calls = [node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)]
    assert not {"hasattr", "getattr"} & set(calls)


def test_the_interfaces_declare_their_optional_parts_with_defaults():
    class Plain(Drafter):
        name = "plain"

        def propose(self, context, k, sampling, generator, gate=None):
            return Draft.empty()

    drafter = Plain()
    members = {name for name in (*dir(Drafter), *Drafter.__annotations__) if not name.startswith("_")}
    assert members == {"name", "free", "needs", "for_pair", "reset", "fork", "observe", "propose", "parts"}
    assert (drafter.free, drafter.needs, Needs().features, Needs().successors) == (False, Needs(), (), 0)
    assert drafter.parts() == ((), drafter) and not drafts_trees(drafter) and not isinstance(drafter, TreeDrafting)
    schedule = FixedK(3)
    assert isinstance(schedule, KSchedule) and not schedule.reads_offer and not schedule.trees
    assert schedule.gate("head", 3) is None and schedule.plan({"lookup": 2}, "head", 8) == Plan(3, Take.AS_IS)


def test_composites_derive_what_they_need_and_whether_they_draft_trees_from_their_parts():
    class Reads(Drafter):
        name, needs = "reads", Needs(features=(2, -1))

    class Tops(Drafter):
        name, free, needs = "tops", True, Needs(successors=3)

    class Trees(TreesOnly):
        name = "trees"

    assert LookupFirst(Reads()).needs == Needs((2, -1), 0)
    assert Beside(LookupFirst(Reads()), (Tops(),)).needs == Needs((2, -1), 3)
    beside_a_tree = Beside(Trees(), (Tops(),))
    assert beside_a_tree.needs == Needs((), 3) and drafts_trees(beside_a_tree)
    assert drafts_trees(LookupFirst(Trees())) and not drafts_trees(LookupFirst(Reads())) and not drafts_trees(None)


def test_a_schedule_that_plans_trees_is_refused_a_learned_drafter_that_drafts_none(target, similar):
    class Trees(FixedK):
        trees = True

        def plan(self, offers, learned, room):
            return Plan(self.k, Take.TREE, learned)

    chain = ModelDrafter(similar, target.config.vocab_size)
    for drafter in (chain, LookupFirst(chain)):
        with pytest.raises(ValueError, match="may plan trees, and drafter '(ngram\\+)?model' has no learned drafter"):
            next(SpeculativeEngine(target, drafter, {1}).generate(PROMPT, k=Trees(3), max_new_tokens=4))
    Trees.trees = False  # a schedule that plans a tree it never declared: refused in its first round
    with pytest.raises(ValueError, match="schedule planned a tree; drafter 'model' drafts no trees"):
        next(SpeculativeEngine(target, chain, {1}).generate(PROMPT, k=Trees(3), max_new_tokens=4))


def test_a_schedule_that_reads_no_offer_plans_every_round_without_one(target, similar):
    class AsIs(KSchedule):
        def __init__(self):
            self.seen = []

        def plan(self, offers, learned, room):
            self.seen.append((offers, learned))
            return Plan(2, Take.AS_IS)

    schedule = AsIs()
    drafter = LookupFirst(ModelDrafter(similar, target.config.vocab_size))
    events = list(SpeculativeEngine(target, drafter, {1}).generate(
        PROMPT, k=schedule, max_new_tokens=12, sampling=SamplingParams()))
    assert schedule.seen == [({}, "model")] * len(events) and all(e.k == 2 for e in events[:-1])
