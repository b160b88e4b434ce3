"""Trees through the engine: token identity with plain decoding for many shapes, the cache and the
head's features keep exactly the accepted path, and sampling keeps the target's exact distribution."""

import random

import pytest
import torch
from conftest import PROMPT, decode
from exactness import assert_lossless, small_models

from specdec_cli.decoding import engine as engine_module
from specdec_cli.decoding.acceptance import SamplingParams
from specdec_cli.decoding.drafters.base import Draft, Drafter, Needs, TreesOnly, Verified
from specdec_cli.decoding.engine import SpeculativeEngine
from specdec_cli.decoding.drafters.head import HeadDrafter, HeadTree
from specdec_cli.decoding.head_network import DraftHead, head_config
from specdec_cli.decoding.kv import reserved_cache
from specdec_cli.decoding.tree import Tree, TreeShape, best_nodes



class OracleTree(Drafter):
    """Random trees of up to K nodes in which the target's true continuation is one branch, hidden at
    a random depth and sibling rank: acceptance deep in later branches, so the kept path is rarely a
    prefix of the block and the cache must be gathered, not cropped."""

    name = "oracle"
    needs = Needs(features=(-1,))

    def __init__(self, future: list[int], seed: int, vocab: int = 98):
        self.future, self.seed, self.vocab, self.features = future, seed, vocab, []

    def reset(self):
        self.features = []

    def observe(self, verified):
        if verified.features is not None:
            self.features.append(verified.features.clone())

    def propose(self, context, k, sampling, generator, gate=None):
        n = context.shape[0]
        rng = random.Random(self.seed * 1000 + n)
        truth = self.future[n:] if self.future[:n] == context.tolist() else []
        tokens, parents, on_path, depth = [], [], {0: True}, {0: 0}
        children = {0: set()}
        for node in range(1, k + 1):
            parent = rng.randrange(node)
            d = depth[parent]
            want_truth = on_path[parent] and d < len(truth) and truth[d] not in children[parent] and rng.random() < 0.5
            token = truth[d] if want_truth else rng.choice([t for t in range(2, self.vocab) if t not in children[parent]])
            tokens.append(token), parents.append(parent)
            children[parent].add(token)
            children[node], depth[node] = set(), d + 1
            on_path[node] = on_path[parent] and d < len(truth) and token == truth[d]
        return Draft(torch.tensor(tokens, dtype=torch.long), parents=tuple(parents))


def prompt_seen(features):
    """What the engine shows a drafter of the prompt: the target's features of its cached positions."""
    return Verified(torch.tensor(PROMPT), len(PROMPT), features=features)


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8, 12])
@pytest.mark.parametrize("seed", range(4))
def test_greedy_trees_of_many_shapes_are_token_identical_to_plain(target, plain, k, seed):
    tokens, events = decode(target, OracleTree(PROMPT + plain, seed), k)
    assert tokens == plain
    assert all(len(e.drafted) == e.nodes <= k and (e.parents is not None or not e.drafted) for e in events)
    gathered = [e for e in events if e.accepted and list(e.parents[: e.accepted]) != list(range(e.accepted))]
    if k >= 5:
        assert sum(e.accepted for e in events) > len(events) // 2  # the oracle's branch is found and kept
        assert gathered  # some kept path was not the block's prefix


@pytest.mark.parametrize("nodes, width, depth", [(1, 1, 1), (4, 2, 3), (6, 1, 6), (8, 3, 5), (10, 4, 4), (16, 8, 3)])
def test_greedy_with_head_trees_is_token_identical_to_plain(target, plain, nodes, width, depth):
    torch.manual_seed(3)
    drafter = HeadTree(HeadDrafter(DraftHead(head_config(target)), target), width, depth)
    tokens, events = decode(target, drafter, nodes)
    assert tokens == plain
    first = Tree(torch.tensor([PROMPT[-1], *events[0].drafted]), (-1, *events[0].parents))  # a valid tree
    assert len(first) == nodes + 1 and int(first.depths().max()) <= depth


def test_tree_of_width_one_is_the_heads_chain(target):
    torch.manual_seed(3)
    drafter = HeadDrafter(DraftHead(head_config(target)), target)
    with torch.no_grad():
        features = target.model(torch.tensor([PROMPT[:-1]])).last_hidden_state[0]
    drafter.observe(prompt_seen(features))
    chain = drafter.propose(torch.tensor(PROMPT), 5, SamplingParams(), None)
    drafter.reset()
    drafter.observe(prompt_seen(features))
    tree = drafter.propose_tree(torch.tensor(PROMPT), TreeShape(5, width=1, depth=5))
    assert tree.tokens.tolist() == chain.tokens.tolist() and tree.parents == (0, 1, 2, 3, 4)
    assert drafter.cache.get_seq_length() == len(PROMPT) + 4  # true positions, then the expanded nodes


def test_each_head_tree_node_is_a_top_child_of_its_path_run_alone(target):
    """The masked per-level head forward computes every path as the head would run it alone."""
    torch.manual_seed(3)
    head = DraftHead(head_config(target))
    drafter = HeadDrafter(head, target)
    with torch.no_grad():
        features = target.model(torch.tensor([PROMPT[:-1]])).last_hidden_state[0]
    drafter.observe(prompt_seen(features))
    tree_draft = drafter.propose_tree(torch.tensor(PROMPT), TreeShape(8, width=3, depth=4))
    tree = Tree(torch.tensor([PROMPT[-1], *tree_draft.tokens.tolist()]), (-1, *tree_draft.parents))
    assert int(tree.depths().max()) >= 2  # the check below reaches past the first level
    for node in range(1, len(tree)):
        alone = HeadDrafter(head, target)
        alone.observe(prompt_seen(features))
        with torch.no_grad():
            guess, _ = alone._catch_up(torch.tensor(PROMPT))
            for ancestor in tree.path_to(node)[1:-1]:  # the path alone, one causal step per token
                guess = alone._step(tree.tokens[ancestor].view(1), guess.view(1, -1), alone.cache.get_seq_length())
            assert int(tree.tokens[node]) in alone._logits(guess).topk(3).indices.tolist()


def test_best_nodes_keep_parents_with_their_children():
    scores, parents = [-0.1, -0.5, -0.3, -0.35, -2.0], [-1, -1, 0, 0, 1]
    assert best_nodes(scores, parents, 3) == [0, 2, 3]
    assert best_nodes(scores, parents, 4) == [0, 1, 2, 3]
    assert best_nodes([0.0, 0.0, 0.0], [-1, 0, 1], 2) == [0, 1]  # ties go to the ancestor


def test_cache_and_head_features_keep_exactly_the_accepted_path(target, plain, monkeypatch):
    made = []

    def recorded(config):
        made.append(reserved_cache(config))
        return made[-1]

    monkeypatch.setattr(engine_module, "reserved_cache", recorded)
    drafter = OracleTree(PROMPT + plain, seed=1)
    tokens = list(PROMPT)
    checked = 0
    for event in SpeculativeEngine(target, drafter, {1}).generate(PROMPT, k=8, max_new_tokens=30):
        tokens += event.emitted
        cache = made[0]
        assert cache.get_seq_length() == len(tokens) - 1
        if event.accepted >= 2:
            with torch.no_grad():
                fresh = target(torch.tensor([tokens[:-1]]), use_cache=True).past_key_values
            for mine, theirs in zip(cache.layers, fresh.layers):
                torch.testing.assert_close(mine.keys, theirs.keys, atol=1e-5, rtol=1e-4)
                torch.testing.assert_close(mine.values, theirs.values, atol=1e-5, rtol=1e-4)
            checked += 1
    assert checked >= 3
    with torch.no_grad():
        expected = target.model(torch.tensor([tokens[:-1]])).last_hidden_state[0]
    torch.testing.assert_close(torch.cat(drafter.features), expected, atol=1e-4, rtol=1e-4)


def test_a_tree_round_reports_its_path_and_the_children_it_refused(target, plain):
    truth = plain[0]
    wrong = [t for t in (20, 21, 22) if t != truth]

    class Fixed(Drafter):
        name = "fixed"

        def reset(self):
            pass

        def propose(self, context, k, sampling, generator, gate=None):
            # root → wrong0, truth; truth → wrong1, wrong2: the path is [truth], then both children refused
            return Draft(torch.tensor([wrong[0], truth, wrong[1], wrong[2]]), parents=(0, 0, 2, 2))

    event = next(iter(SpeculativeEngine(target, Fixed(), {1}).generate(PROMPT, k=4, max_new_tokens=10)))
    assert event.emitted[:1] == [truth] and event.accepted == 1
    assert event.rejected == wrong[1:] and event.judged == 3 and event.nodes == 4


class FixedTree(TreesOnly):  # a tree drafter: its node count is not cut to the two-token budget
    """The same tree whatever the context: candidates the target may find unlikely, tried first."""

    name = "fixed"

    def reset(self):
        pass

    def propose(self, context, k, sampling, generator, gate=None):
        return Draft(torch.tensor([7, 6, 0, 1, 2, 3]), parents=(0, 0, 1, 1, 2, 2))


@pytest.fixture(scope="module")
def small():
    return small_models()


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [SamplingParams(1.0), SamplingParams(0.7, top_k=5)])
def test_tree_sampling_keeps_the_targets_exact_distribution(small, sampling):
    target, _ = small
    assert_lossless(target, FixedTree(), sampling, k=6)


@pytest.mark.slow
def test_head_tree_sampling_keeps_the_targets_exact_distribution(small):
    target, _ = small
    torch.manual_seed(0)
    drafter = HeadTree(HeadDrafter(DraftHead(head_config(target)), target), width=3, depth=3)
    assert_lossless(target, drafter, SamplingParams(1.0), k=6)
