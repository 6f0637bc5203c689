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


def test_an_eagle_node_that_only_the_relaxed_rule_would_pass_is_rejected_in_a_mixed_tree():
    """Source-aware: the same plausible token (7, rank 2, gap 1, then w strict matches) passes as a
    retrieved node and fails as a model node, in one tree that holds both sources."""
    rows = [(1, {}), (2, {7: 9.0}), (3, {}), (4, {}), (5, {}), (2, {}), (3, {})]
    lg = logits_for(rows)
    tokens = [0, 1, 7, 3, 4, 5, 8]           # path 0-1-2-3-4-5 and a short retrieved branch 1 -> 8
    parents = [-1, 0, 1, 2, 3, 4, 1]
    as_retrieval = DraftTree.from_parents(tokens, parents, "retrieval")
    control = verify_greedy(as_retrieval, lg, RELAX)
    assert control.path == (0, 1, 2, 3, 4, 5) and control.num_relaxed == 1, "the control must relax node 2"
    mixed = DraftTree.from_parents(tokens, parents, ["root", "retrieval", "eagle", "retrieval", "retrieval",
                                                     "retrieval", "retrieval"])
    v = verify_greedy(mixed, lg, RELAX)
    assert v.path == (0, 1) and v.num_relaxed == 0, "An EAGLE node must be verified strictly."
    assert v.node_status[2] == "rejected" and v.node_status[6] == "rejected" and v.next_token == 2


# ------------------------------------------------------------------------------- relax.mode
from respec.config import RELAX_MODES, EngineConfig  # noqa: E402
from respec.errors import ConfigError  # noqa: E402
from respec.verify import node_relaxable, path_tolerates, walk_relaxed_path  # noqa: E402


def test_relax_modes_are_validated_and_parsed_as_names():
    assert set(RELAX_MODES) == {"lookahead", "fly", "shift"} and RelaxConfig().mode == "lookahead"
    assert EngineConfig().with_overrides({"relax.mode": " fly "}).relax.mode == "fly"
    assert EngineConfig().with_overrides({"relax_mode": "shift"}).relax.mode == "shift"
    for bad in ("strict", "", 3, None, ["fly"]):
        with pytest.raises(ConfigError, match="RelaxConfig.mode"):
            EngineConfig().with_overrides({"relax.mode": bad})
    cfg = EngineConfig().with_overrides({"method": "respec", "relax.mode": "fly"})
    assert cfg.to_dict()["relax"]["mode"] == "fly" and EngineConfig.from_dict(cfg.to_dict()) == cfg
    old = cfg.to_dict()
    del old["relax"]["mode"]
    assert EngineConfig.from_dict(old).relax.mode == "lookahead", "a trace written before relax.mode loads"


def test_node_relaxable_applies_beta_tau_only_in_lookahead_mode():
    r = RelaxConfig(beta=3, tau=2.0)
    assert node_relaxable("lookahead", "retrieval", 7, 2, rank=2, gap=1.0, relax=r)
    assert not node_relaxable("lookahead", "retrieval", 7, 2, rank=4, gap=1.0, relax=r)
    assert not node_relaxable("lookahead", "retrieval", 7, 2, rank=2, gap=2.5, relax=r)
    for mode in ("fly", "shift"):
        assert node_relaxable(mode, "retrieval", 7, 2, rank=40, gap=9.0, relax=r)
    for mode in RELAX_MODES:
        assert not node_relaxable(mode, "eagle", 7, 2, rank=1, gap=0.0, relax=r)
        assert not node_relaxable(mode, "retrieval", 7, 2, rank=1, gap=0.0, relax=r, no_relax_ids=frozenset({7}))
        assert not node_relaxable(mode, "retrieval", 7, 2, rank=1, gap=0.0, relax=r, no_relax_ids=frozenset({2}))


def test_path_tolerates_lookahead_and_shift():
    #          root d1 d2 d3 d4
    tokens = [0, 1, 7, 3, 4]
    wanted = [0, 1, 3, 3, 4]       # a_2 = 3, and the draft's next token d3 = 3 (an inserted 7)
    assert path_tolerates("lookahead", 2, tokens, wanted, 2) and path_tolerates("fly", 2, tokens, wanted, 2)
    assert not path_tolerates("fly", 2, tokens, wanted, 3), "the last w tokens can never be relaxed"
    assert path_tolerates("shift", 2, tokens, wanted, 2)
    other = [0, 1, 2, 3, 4]        # a_2 = 2 != d3: the draft does not re-align one position later
    assert path_tolerates("fly", 2, tokens, other, 2) and not path_tolerates("shift", 2, tokens, other, 2)
    assert not path_tolerates("fly", 2, tokens, [0, 1, 3, 9, 4], 1), "d3 must match exactly"


def test_walk_relaxed_path_counts_and_budget_per_mode():
    tokens = [0, 1, 7, 3, 4, 8, 6, 1]
    wanted = [0, 1, 2, 3, 4, 5, 6, 1]
    ok = [True] * len(tokens)
    assert walk_relaxed_path(tokens, wanted, ok, RelaxConfig(lookahead=2, budget=2)) == (7, (2, 5))
    assert walk_relaxed_path(tokens, wanted, ok, RelaxConfig(lookahead=2, budget=1)) == (4, (2,))
    assert walk_relaxed_path(tokens, wanted, ok, RelaxConfig(lookahead=2, budget=0)) == (1, ())
    assert walk_relaxed_path(tokens, wanted, [True, True, False] + [True] * 5, RelaxConfig(lookahead=2)) == (1, ())
    assert walk_relaxed_path(tokens, wanted, ok, RelaxConfig(lookahead=2, mode="shift")) == (1, ())


FAR_ROWS = [(1, {}), (2, {7: 5.0}), (3, {}), (4, {}), (5, {}), (6, {})]   # 7: rank 2, gap 5 > τ


def test_fly_mode_relaxes_what_the_lookahead_mode_refuses():
    tree = chain([1, 7, 3, 4, 5])
    assert verify_greedy(tree, logits_for(FAR_ROWS), RELAX).path == (0, 1), "gap 5 > τ = 2"
    v = verify_greedy(tree, logits_for(FAR_ROWS), RelaxConfig(beta=3, tau=2.0, lookahead=2, budget=1, mode="fly"))
    assert v.path == (0, 1, 2, 3, 4, 5) and v.num_relaxed == 1 and v.node_status[2] == "relaxed"
    eagle = verify_greedy(chain([1, 7, 3, 4, 5], "eagle"), logits_for(FAR_ROWS),
                          RelaxConfig(lookahead=2, budget=1, mode="fly"))
    assert eagle.path == (0, 1), "no mode relaxes a model node"


def test_shift_mode_accepts_an_inserted_token_only():
    # the target wants 1 2 3 ...; the draft inserts 7 before 2: 1 7 2 3 4; after 7 the target still wants 2
    rows = [(1, {}), (2, {}), (2, {}), (3, {}), (4, {}), (5, {})]
    shift = RelaxConfig(lookahead=2, budget=1, mode="shift")
    v = verify_greedy(chain([1, 7, 2, 3, 4]), logits_for(rows), shift)
    assert v.path == (0, 1, 2, 3, 4, 5) and v.num_relaxed == 1 and v.next_token == 5
    # a substitution (7 in place of 2, then 3 as wanted) is not an insertion: shift refuses it
    sub = verify_greedy(chain([1, 7, 3, 4, 5]), logits_for(ROWS), shift)
    assert sub.path == (0, 1) and sub.num_relaxed == 0
    assert verify_greedy(chain([1, 7, 3, 4, 5]), logits_for(ROWS), RELAX).num_relaxed == 1


@pytest.mark.parametrize("mode", ["lookahead", "fly", "shift"])
def test_budget_zero_is_strict_in_every_mode(mode):
    tree = chain([1, 7, 2, 3, 4])
    lg = logits_for([(1, {}), (2, {7: 9.0}), (2, {}), (3, {}), (4, {}), (5, {})])
    assert verify_greedy(tree, lg, RelaxConfig(budget=0, mode=mode)) == verify_strict(tree, lg)
