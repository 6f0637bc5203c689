"""DraftTree: derived views (depths, ancestor mask, root-to-leaf paths, trie merge) on hand-drawn trees."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from respec.tree import DraftTree


def test_chain_is_a_tree_with_one_path():
    t = DraftTree.chain(7, [1, 2, 3], "retrieval")
    assert t.parents == (-1, 0, 1, 2)
    assert t.depths() == (0, 1, 2, 3)
    assert t.retrieve_indices().tolist() == [[0, 1, 2, 3]], "A chain must have exactly one root-to-leaf path."
    assert torch.equal(t.attention_mask(), torch.ones(4, 4, dtype=torch.bool).tril()), \
        "A chain's ancestor mask must be the causal mask."


def test_worked_example_mask():
    t = DraftTree.from_parents([9, 1, 2, 3], [-1, 0, 0, 1], "eagle")
    assert t.attention_mask().int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    assert t.depths() == (0, 1, 1, 2)
    assert sorted(map(tuple, t.retrieve_indices().tolist())) == [(0, 1, 3), (0, 2, -1)]


@st.composite
def random_trees(draw):
    n = draw(st.integers(1, 30))
    parents = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]
    return DraftTree.from_parents(list(range(n)), parents, "eagle")


@settings(max_examples=100, deadline=None)
@given(random_trees())
def test_mask_depth_and_paths_agree_with_parents(tree):
    mask = tree.attention_mask()
    for i in range(tree.size):
        ancestors = set(tree.path_to(i))
        assert {j for j in range(tree.size) if mask[i, j]} == ancestors, "Mask row must be ancestors-or-self."
        assert tree.depths()[i] == len(ancestors) - 1, "Depth must equal the number of ancestors."
    rows = [tuple(x for x in r if x >= 0) for r in tree.retrieve_indices().tolist()]
    assert len(rows) == len(set(rows)) == len(tree.leaves()), "Each leaf path must appear exactly once."
    for r in rows:
        assert r == tree.path_to(r[-1])


def test_trie_merges_shared_prefixes_and_respects_budget():
    t = DraftTree.trie(5, [[1, 2, 3], [1, 2, 4], [6]], budget=10, path_scores=[0.9, 0.5, 0.7])
    assert t.tokens == (5, 1, 2, 3, 4, 6)
    assert t.parents == (-1, 0, 1, 2, 2, 0)
    assert t.scores[1] == 0.9 and t.scores[4] == 0.5
    small = DraftTree.trie(5, [[1, 2, 3], [1, 2, 4], [6]], budget=3)
    assert small.size == 3 and small.tokens == (5, 1, 2), "The budget counts the root and keeps the best path first."


@pytest.mark.parametrize("bad", [dict(tokens=[1, 2], parents=[-1, 1]), dict(tokens=[1, 2], parents=[0, 0]),
                                 dict(tokens=[1, 2], parents=[-1])])
def test_invalid_trees_are_rejected(bad):
    with pytest.raises(ValueError):
        DraftTree.from_parents(bad["tokens"], bad["parents"], "eagle")


def test_dict_round_trip():
    t = DraftTree.from_parents([9, 1, 2], [-1, 0, 0], ["root", "eagle", "retrieval"], scores=[0, -0.5, 0.7])
    assert DraftTree.from_dict(t.to_dict()) == t
