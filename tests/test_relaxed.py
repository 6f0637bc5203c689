"""Every branch of ReSpec's source-aware relaxed rule, with hand-built logits (ALGORITHMS.md §1.6)."""
import pytest
import torch

from respec.config import RelaxConfig
from respec.tree import DraftTree
from respec.verify import verify_greedy, verify_strict

V = 10
RELAX = RelaxConfig(beta=3, tau=2.0, lookahead=2, budget=1)


def logits_for(rows):
    """rows[i] = (top1, {token: logit}) -> row i: top1 gets 10.0, listed tokens their logit, rest 0."""
    x = torch.zeros(len(rows), V)
    for i, (top, others) in enumerate(rows):
        x[i, top] = 10.0
        for t, v in others.items():
            x[i, t] = v
    return x


def chain(draft, source="retrieval"):
    return DraftTree.chain(0, draft, source)


# Target wants 1 2 3 4 5 6; the draft has 7 in place of 2 (rank 2, gap 1.0 -> plausible).
WANT = [1, 2, 3, 4, 5, 6]
ROWS = [(1, {}), (2, {7: 9.0}), (3, {}), (4, {}), (5, {}), (6, {})]


def test_plausible_token_followed_by_w_strict_matches_is_relaxed():
    v = verify_greedy(chain([1, 7, 3, 4, 5]), logits_for(ROWS), RELAX)
    assert v.path == (0, 1, 2, 3, 4, 5) and v.num_relaxed == 1
    assert v.node_status[2] == "relaxed" and v.next_token == 6


def test_strict_match_needs_no_relaxation():
    v = verify_greedy(chain([1, 2, 3]), logits_for(ROWS), RELAX)
    assert v.num_accepted == 3 and v.num_relaxed == 0


def test_top_beta_failure_rejects():
    rows = [(1, {}), (2, {8: 9.5, 9: 9.4, 5: 9.3, 7: 9.0}), (3, {}), (4, {}), (5, {})]  # 7 has rank 5 > β=3
    v = verify_greedy(chain([1, 7, 3, 4]), logits_for(rows), RELAX)
    assert v.path == (0, 1) and v.num_relaxed == 0 and v.next_token == 2


def test_tau_failure_rejects():
    rows = [(1, {}), (2, {7: 7.5}), (3, {}), (4, {}), (5, {})]  # gap 2.5 > τ=2
    v = verify_greedy(chain([1, 7, 3, 4]), logits_for(rows), RELAX)
    assert v.path == (0, 1)


def test_lookahead_failure_rejects():
    rows = [(1, {}), (2, {7: 9.0}), (3, {}), (9, {}), (5, {})]  # after 7: 3 matches, then 4 != 9
    v = verify_greedy(chain([1, 7, 3, 4]), logits_for(rows), RELAX)
    assert v.path == (0, 1), "A relaxed token needs w strict matches after it."


def test_last_w_tokens_can_never_be_relaxed():
    v = verify_greedy(chain([1, 7, 3]), logits_for(ROWS), RELAX)   # only 1 token after 7, w = 2
    assert v.path == (0, 1)


def test_budget_is_never_exceeded():
    rows = [(1, {}), (2, {7: 9.0}), (3, {}), (4, {}), (5, {8: 9.0}), (6, {}), (1, {}), (2, {})]
    draft = [1, 7, 3, 4, 8, 6, 1]
    one = verify_greedy(chain(draft), logits_for(rows), RELAX)
    assert one.num_relaxed == 1 and one.path == (0, 1, 2, 3, 4), "Budget 1 allows one relaxation per step."
    two = verify_greedy(chain(draft), logits_for(rows), RelaxConfig(beta=3, tau=2.0, lookahead=2, budget=2))
    assert two.num_relaxed == 2 and two.num_accepted == 7


def test_budget_zero_is_exactly_strict():
    tree = chain([1, 7, 3, 4, 5])
    lg = logits_for(ROWS)
    assert verify_greedy(tree, lg, RelaxConfig(budget=0)) == verify_strict(tree, lg)


@pytest.mark.parametrize("special", [7, 2], ids=["draft token special", "target top-1 special"])
def test_special_tokens_are_never_relaxed(special):
    v = verify_greedy(chain([1, 7, 3, 4, 5]), logits_for(ROWS), RELAX, no_relax_ids=frozenset({special}))
    assert v.path == (0, 1) and v.num_relaxed == 0


def test_eagle_nodes_are_verified_strictly():
    v = verify_greedy(chain([1, 7, 3, 4, 5], source="eagle"), logits_for(ROWS), RELAX)
    assert v.path == (0, 1), "Model-drafted nodes must never be relaxed."


def test_tree_prefers_more_accepted_then_fewer_relaxed():
    # branch A: 1 7 3 4 (relaxed, 4 accepted); branch B: 1 2 3 (strict, 3 accepted) -> A wins on length
    tree = DraftTree.from_parents([0, 1, 7, 3, 4, 2, 3], [-1, 0, 1, 2, 3, 1, 5], "retrieval")
    rows = [(1, {}), (2, {7: 9.0}), (3, {}), (4, {}), (5, {}), (3, {}), (4, {})]
    v = verify_greedy(tree, logits_for(rows), RELAX)
    assert v.path == (0, 1, 2, 3, 4) and v.num_relaxed == 1
    # extend branch B to the same length strictly: the strict branch must now win the tie
    tree2 = DraftTree.from_parents([0, 1, 7, 3, 4, 2, 3, 4], [-1, 0, 1, 2, 3, 1, 5, 6], "retrieval")
    rows2 = rows + [(5, {})]
    v2 = verify_greedy(tree2, logits_for(rows2), RELAX)
    assert v2.path == (0, 1, 5, 6, 7) and v2.num_relaxed == 0
