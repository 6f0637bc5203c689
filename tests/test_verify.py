"""Verification with hand-built logits (greedy strict) and a distribution test (sampling)."""
import math

import pytest
import torch

from respec.config import SamplingConfig
from respec.sampling import entropy, probs_from_logits
from respec.tree import DraftTree
from respec.verify import verify_greedy, verify_sampling

V = 8


def onehot_logits(argmaxes):
    """One row per node; row i has its maximum at argmaxes[i]."""
    x = torch.zeros(len(argmaxes), V)
    for i, a in enumerate(argmaxes):
        x[i, a] = 5.0
    return x


def test_perfect_chain_accepts_everything_and_adds_bonus():
    t = DraftTree.chain(0, [1, 2, 3], "eagle")
    v = verify_greedy(t, onehot_logits([1, 2, 3, 4]))
    assert v.path == (0, 1, 2, 3) and v.next_token == 4 and v.num_accepted == 3
    assert v.node_status == ("accepted",) * 4


def test_early_mismatch_stops_at_the_first_wrong_token():
    t = DraftTree.chain(0, [1, 2, 3], "eagle")
    v = verify_greedy(t, onehot_logits([1, 5, 3, 4]))
    assert v.path == (0, 1) and v.next_token == 5, "The bonus must be the target's choice after the last accepted node."
    assert v.node_status == ("accepted", "accepted", "rejected", "unvisited")


def test_empty_draft_is_plain_decoding():
    v = verify_greedy(DraftTree.root_only(3), onehot_logits([6]))
    assert v.path == (0,) and v.next_token == 6 and v.num_accepted == 0


def test_second_branch_of_a_tree_can_win():
    # root -> a(1) -> c(3); root -> b(2) -> d(4); target wants 2 then 4 then 7
    t = DraftTree.from_parents([0, 1, 2, 3, 4], [-1, 0, 0, 1, 2], "eagle")
    v = verify_greedy(t, onehot_logits([2, 0, 4, 0, 7]))
    assert v.path == (0, 2, 4) and v.next_token == 7
    assert v.node_status == ("accepted", "rejected", "accepted", "unvisited", "accepted")


def _empirical(tree, logits, n=20000, seed=0):
    gen = torch.Generator().manual_seed(seed)
    probs = probs_from_logits(logits, SamplingConfig(temperature=1.0))
    counts = torch.zeros(V)
    firsts = torch.zeros(V)
    for _ in range(n):
        v = verify_sampling(tree, probs, gen)
        tok = tree.tokens[v.path[1]] if len(v.path) > 1 else v.next_token
        counts[tok] += 1
    return counts / n, probs[0]


def test_sampling_preserves_the_target_distribution_for_trees_and_chains():
    torch.manual_seed(0)
    logits = torch.randn(4, V)
    for tree in (DraftTree.from_parents([0, 3, 5, 1], [-1, 0, 0, 0], "eagle"),   # three siblings
                 DraftTree.chain(0, [3, 5, 1], "retrieval")):                     # a one-hot chain
        freq, p = _empirical(tree, logits)
        tv = 0.5 * (freq - p).abs().sum().item()
        assert tv < 0.02, f"First emitted token must follow the target distribution (TV distance {tv:.3f})."


def test_sampling_second_token_distribution_after_accepting_a_draft():
    # P(second token | first == 3) must equal p(. | node 1) when node 1 (token 3) was drafted.
    torch.manual_seed(1)
    logits = torch.randn(3, V)
    tree = DraftTree.from_parents([0, 3, 2], [-1, 0, 1], "eagle")
    probs = probs_from_logits(logits, SamplingConfig(temperature=0.8))
    gen = torch.Generator().manual_seed(3)
    counts = torch.zeros(V)
    n = 0
    for _ in range(20000):
        v = verify_sampling(tree, probs, gen)
        emitted = [tree.tokens[i] for i in v.path[1:]] + [v.next_token]
        if emitted[0] == 3:
            counts[emitted[1]] += 1
            n += 1
    tv = 0.5 * (counts / n - probs[1]).abs().sum().item()
    assert tv < 0.03, f"The token after an accepted draft must follow p at that node (TV {tv:.3f})."


def test_sampling_is_reproducible_with_a_seed():
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(5))
    tree = DraftTree.from_parents([0, 3, 5, 1], [-1, 0, 0, 1], "eagle")
    probs = probs_from_logits(logits, SamplingConfig(temperature=1.0))
    a = [verify_sampling(tree, probs, torch.Generator().manual_seed(9)) for _ in range(3)]
    assert a[0] == a[1] == a[2], "The same seed must give the same verdict."


def test_top_k_and_top_p_truncate_the_distribution():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0, -2.0, -3.0, -4.0]])
    p = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert (p[0, 2:] == 0).all() and abs(p.sum().item() - 1) < 1e-6
    p = probs_from_logits(logits, SamplingConfig(temperature=1.0, top_p=0.5))
    assert p[0, 0] == 1.0, "top_p=0.5 keeps only the top-1 when it holds more than half of the mass."


def test_entropy_in_nats():
    assert abs(entropy(torch.zeros(1, 4)).item() - torch.log(torch.tensor(4.0)).item()) < 1e-6


def test_number_table_equals_the_eager_numbers_with_ties_and_masked_logits():
    """`number_table` (the form the compiled output layer fuses) against read_numbers (eager): the same top-1 (the first maximal index on a tie), ranks and margins exactly,
    the float columns to rounding; -inf logits give finite entropies."""
    from respec.verify import number_table, read_number_table, read_numbers
    gen = torch.Generator().manual_seed(5)
    tree = DraftTree.from_parents([5, 1, 2, 3, 1, 0, 4], [-1, 0, 0, 1, 1, 2, 5], "eagle")
    logits = torch.randn(tree.size, 9, generator=gen).round(decimals=1)
    logits[1, 2] = logits[1, 6] = logits[1].max() + 0.5          # a tied top-1: index 2 wins, margin 0
    logits[3, 4] = float("-inf")
    tokens = torch.tensor(tree.tokens)
    parents = torch.tensor([max(p, 0) for p in tree.parents])
    fused = read_number_table(number_table(logits, tokens, parents))
    plain = read_numbers(tree, logits)
    assert fused.top1 == plain.top1 and fused.top1[1] == 2 and fused.margins[1] == 0.0
    assert fused.ranks == plain.ranks
    for name in ("margins", "gaps", "logprobs", "probs"):
        assert getattr(fused, name) == pytest.approx(getattr(plain, name), abs=1e-5), name
    finite = [i for i in range(tree.size) if i != 3]
    assert [fused.entropies[i] for i in finite] == pytest.approx([plain.entropies[i] for i in finite], abs=1e-5)
    assert math.isfinite(fused.entropies[3]) and math.isfinite(plain.entropies[3])


def test_read_numbers_match_a_per_node_computation():
    """Ranks, gaps and log-probs of each node under its parent's row, and each row's top-1,
    entropy and margin, against a plain loop."""
    from respec.verify import read_numbers
    gen = torch.Generator().manual_seed(3)
    tree = DraftTree.from_parents([5, 1, 2, 3, 1, 0, 4], [-1, 0, 0, 1, 1, 2, 5], "eagle")
    logits = torch.randn(tree.size, 6, generator=gen)
    logits[2, 0] = logits[2].max() + 1.0          # node 5 (token 0 under node 2) is its row's top-1
    got = read_numbers(tree, logits)
    for i in range(1, tree.size):
        row, tok = logits[tree.parents[i]], tree.tokens[i]
        assert got.ranks[i] == 1 + int((row > row[tok]).sum())
        assert got.gaps[i] == pytest.approx(float(row.max() - row[tok]))
        assert got.logprobs[i] == pytest.approx(float(torch.log_softmax(row, -1)[tok]), abs=1e-6)
        assert got.probs[i] == pytest.approx(float(torch.softmax(row, -1)[tok]), abs=1e-6)
    for i in range(tree.size):
        top2 = logits[i].topk(2).values
        assert got.top1[i] == int(logits[i].argmax())
        assert got.margins[i] == pytest.approx(float(top2[0] - top2[1]))
        assert got.entropies[i] == pytest.approx(float(entropy(logits[i:i + 1])[0]), abs=1e-5)
    assert got.ranks[5] == 1 and got.gaps[5] == 0.0


