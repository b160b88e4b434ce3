"""Rowwise attention at int8/int4: a verify block, a chain or a tree, scores every position bit for
bit as one-token forwards along its own path do."""

from dataclasses import replace

import pytest
import torch
from transformers import DynamicCache

from specdec_cli.decoding.kv import crop_cache
from specdec_cli.decoding.tree import Tree, verify_tree
from specdec_cli.pairs.loading import load
from specdec_cli.pairs.registry import load_registry

pytestmark = pytest.mark.cpu_kernels  # run again on AVX2's kernels (test_cpu_paths.py)


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_a_tree_scores_each_node_exactly_as_one_token_forwards_along_its_path(pair_dir, dtype):
    model = load(replace(load_registry(pair_dir / "models.yaml").pair("tiny").target, dtype=dtype)).model
    ids = torch.randint(3, 98, (1, 20), generator=torch.Generator().manual_seed(2))
    tree = Tree(torch.tensor([5, 17, 23, 40, 41, 9]), (-1, 0, 0, 1, 2, 2))  # siblings: a chain mask would mix them
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(ids, cache=cache, use_cache=True)
        scored = verify_tree(model, cache, tree, torch.device("cpu")).logits[0]
        for node in range(len(tree)):
            crop_cache(cache, ids.shape[1])
            for position in tree.path_to(node):
                last = model(tree.tokens[position].view(1, 1), cache=cache, use_cache=True).logits[0, -1]
            assert torch.equal(scored[node], last), node
