"""Token trees: the masked forward equals each path run alone, compaction keeps exactly the path,
and acceptance keeps the target's output (greedy identity, the race's exact sampled distribution)."""

import pytest
import torch
from conftest import tiny_llama
from scipy.stats import chisquare
from transformers import DynamicCache

from specdec_cli.decoding.acceptance import greedy_accept, residual_distribution
from specdec_cli.decoding.coupling import PositionNoise, race_scores
from specdec_cli.decoding.kv import keep_positions
from specdec_cli.decoding.tree import Tree, attention_mask, best_nodes, greedy_tree_accept, verify_tree

PROMPT = [5, 17, 33, 8, 2, 61]
# root, two children of the root, a grandchild under each, and a third level under the first
TREE = Tree(torch.tensor([40, 7, 9, 11, 12, 13, 14]), (-1, 0, 0, 1, 2, 3, 3))


def test_tree_refuses_a_parent_after_its_child_and_a_missing_root():
    with pytest.raises(ValueError):
        Tree(torch.tensor([1, 2, 3]), (-1, 2, 0))
    with pytest.raises(ValueError):
        Tree(torch.tensor([1, 2]), (0, 0))
    with pytest.raises(ValueError):
        Tree(torch.tensor([1, 2]), (-1, 1))  # a node its own parent


def test_mask_lets_each_node_see_the_cache_and_its_ancestors_only():
    mask = attention_mask(TREE, cached=2)[0, 0]
    assert mask.shape == (7, 9)
    assert mask[:, :2].all()
    assert mask[5, 2:].tolist() == [True, True, False, True, False, True, False]  # 5 → 3 → 1 → 0
    additive = attention_mask(TREE, cached=2, dtype=torch.float32)[0, 0]
    assert torch.equal(additive == 0, mask)
    assert TREE.depths().tolist() == [0, 1, 1, 2, 2, 3, 3]
    assert TREE.path_to(6) == [0, 1, 3, 6]


def prefilled(model, tokens):
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.tensor([tokens]), cache=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_tree_forward_equals_each_path_run_alone(attention):
    model = tiny_llama(seed=3, attn_implementation=attention)
    with torch.no_grad():
        tree_logits = verify_tree(model, prefilled(model, PROMPT), TREE, torch.device("cpu")).logits[0]
        for leaf in (4, 5, 6):
            path = TREE.path_to(leaf)
            alone = model(torch.tensor([PROMPT + TREE.tokens[path].tolist()])).logits[0, len(PROMPT):]
            torch.testing.assert_close(tree_logits[path], alone, atol=1e-4, rtol=1e-4)


def test_keeping_the_accepted_path_leaves_the_cache_of_that_path_alone():
    model = tiny_llama(seed=3)
    cache = prefilled(model, PROMPT)
    with torch.no_grad():
        verify_tree(model, cache, TREE, torch.device("cpu"))
        path = TREE.path_to(5)  # root, 1, 3, 5
        keep_positions(cache, torch.cat([torch.arange(len(PROMPT)), len(PROMPT) + torch.tensor(path)]))
        assert cache.get_seq_length() == len(PROMPT) + len(path)
        after = model(torch.tensor([[50]]), cache=cache, use_cache=True).logits[0, -1]
        fresh = model(torch.tensor([PROMPT + TREE.tokens[path].tolist() + [50]])).logits[0, -1]
    torch.testing.assert_close(after, fresh, atol=1e-4, rtol=1e-4)


def test_greedy_follows_the_branch_the_target_would_take():
    logits = torch.zeros(7, 20)
    logits[0, 9] = logits[2, 12] = logits[4, 3] = 1.0  # root → 9 (node 2) → 12 (node 4) → 3: not drafted
    assert greedy_tree_accept(TREE, logits) == ([2, 4], 3)
    logits[0, 9], logits[0, 15] = 0.0, 1.0  # the target wants 15 first: no node matches
    assert greedy_tree_accept(TREE, logits) == ([], 15)


def test_greedy_on_a_chain_is_the_chain_rule():
    torch.manual_seed(0)
    for _ in range(50):
        drafts = torch.randint(0, 4, (3,))
        logits = torch.randn(4, 4)
        path, token = greedy_tree_accept(Tree.chain(torch.cat([torch.tensor([0]), drafts])), logits)
        assert (len(path), token) == greedy_accept(drafts, logits)


VOCAB = 4
P_ROOT = torch.tensor([0.1, 0.2, 0.3, 0.4])
Q_ROOT = torch.tensor([0.6, 0.3, 0.05, 0.05])  # the draft is sure of token 0, which the target finds unlikely
FORK = Tree(torch.tensor([3, 0, 1, 2]), (-1, 0, 0, 1))  # top-2 children of the root (0, 1); 2 under 0
P_ROWS = torch.stack([P_ROOT, torch.tensor([0.5, 0.1, 0.1, 0.3]), torch.tensor([0.25] * 4), torch.tensor([0.7, 0.1, 0.1, 0.1])])


def race_accept(tree, p, seed):
    """The engine's rule under sampling: the greedy walk over the race's scores, each node's row under
    the noise of the position it scores (the root's next position plus the node's depth)."""
    return greedy_tree_accept(tree, race_scores(p, PositionNoise(seed, VOCAB, origin=0).rows(tree.depths().tolist())))


def outcome_counts(accept, n=20000):
    """Counts of (first token, second token or none) from one round under seeds 0 to n - 1, as a flat vector."""
    counts = torch.zeros(VOCAB * (VOCAB + 1))
    for seed in range(n):
        path, token = accept(FORK, P_ROWS, seed)
        emitted = [int(FORK.tokens[i]) for i in path] + [token]
        counts[emitted[0] * (VOCAB + 1) + (emitted[1] if len(emitted) > 1 else VOCAB)] += 1
    return counts


def exact_outcomes():
    """P(first, second): a first token that is a node continues from that node's row; else it ends the round."""
    probs = torch.zeros(VOCAB * (VOCAB + 1))
    node_of = {int(FORK.tokens[c]): c for c in FORK.children(0)}
    for a in range(VOCAB):
        if a in node_of:
            probs[a * (VOCAB + 1) : a * (VOCAB + 1) + VOCAB] = P_ROOT[a] * P_ROWS[node_of[a]]
        else:
            probs[a * (VOCAB + 1) + VOCAB] = P_ROOT[a]
    return probs


def pvalue(counts, probs):
    keep = probs > 0
    assert counts[~keep].sum() == 0
    return chisquare(counts[keep].tolist(), (probs[keep] * counts.sum()).tolist()).pvalue


def test_the_race_over_a_tree_keeps_the_target_distribution_exactly():
    assert pvalue(outcome_counts(race_accept), exact_outcomes()) > 1e-3


def test_min_p_over_q_on_top_k_children_is_caught():
    def ratio_rule(tree, p, seed):  # the tempting rule: chain acceptance applied to each child in turn
        generator = torch.Generator().manual_seed(seed)
        row = p[0].clone()
        for child in tree.children(0):
            x = int(tree.tokens[child])
            if float(torch.rand((), generator=generator)) < min(1.0, float(row[x] / Q_ROOT[x])):
                return [child], int(torch.multinomial(p[child], 1, generator=generator))
            row = residual_distribution(row, Q_ROOT)
        return [], int(torch.multinomial(residual_distribution(row, Q_ROOT), 1, generator=generator))

    assert pvalue(outcome_counts(ratio_rule, n=5000), exact_outcomes()) < 1e-6


def test_a_child_the_target_gives_no_mass_is_never_kept():
    fork = Tree(torch.tensor([3, 2, 0]), (-1, 0, 0))  # the root's children: token 2 (no mass), then token 0
    p = torch.tensor([[0.5, 0, 0, 0.5], [0, 0, 0, 1.0], [0, 1.0, 0, 0]])
    outcomes = {tuple(race_accept(fork, p, seed)[0]) for seed in range(200)}
    assert outcomes == {(), (2,)}  # token 3 ends the round, token 0 keeps node 2; node 1 never


def test_best_nodes_leave_out_impossible_candidates_and_refuse_a_choice_without_a_parent():
    assert best_nodes([-0.1, float("-inf"), -2.0], [-1, -1, -1], 3) == [0, 2]  # -inf: a token outside --top-vocab
    with pytest.raises(AssertionError, match="parent was left out"):
        best_nodes([-1.0, -0.5], [-1, 0], 1)  # a score that rose from parent to child


def test_rowwise_attention_verifies_a_tree_exactly_as_one_token_forwards_along_each_path():
    """The int4 targets' attention (runtime/rowwise_attention.py) scores each row alone: for a tree it
    must gather the row's ancestors, not its causal prefix (which holds its siblings)."""
    from specdec_cli.runtime.rowwise_attention import use_rowwise_attention

    model = tiny_llama(seed=3)
    use_rowwise_attention(model)
    with torch.no_grad():
        tree_logits = verify_tree(model, prefilled(model, PROMPT), TREE, torch.device("cpu")).logits[0]
        for leaf in (4, 5, 6):
            cache = prefilled(model, PROMPT)
            for node in TREE.path_to(leaf):  # the root, then the path, one token at a time
                step = model(torch.tensor([[int(TREE.tokens[node])]]), cache=cache, use_cache=True).logits[0, -1]
                # float32 linears may round differently by row count; seeing a sibling moves logits by far more
                torch.testing.assert_close(tree_logits[node], step, atol=1e-5, rtol=1e-5)
