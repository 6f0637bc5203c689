"""ReSpec's WHEN and WHAT pieces: trigger formula, EMA update and inheritance, draft lengths, the
retrieval trie, fallback, and budget/special-token guarantees through the engine."""
import pytest

from respec.config import EngineConfig, TriggerConfig
from respec.errors import ConfigError
from respec.drafters import make_drafter
from respec.drafters.base import DraftContext
from respec.drafters.respec import draft_length, ema_update, entropy_trigger
from tests.conftest import make_target, run


@pytest.mark.parametrize("hs,scores,k,mean,fires", [
    ((2.0, 0.6, 0.9), (1.9, 1.25, 1.5), 2, 0.75, True),
    ((1.0, 2.5, 3.0), (4.0, 3.25, 2.5), 3, 2.1667, False),
])
def test_trigger_worked_examples(hs, scores, k, mean, fires):
    t = entropy_trigger(hs, TriggerConfig(window=3, theta_entropy=1.5, lambda_e=1.0))
    assert t.scores == pytest.approx(scores) and t.k_star == k
    assert t.mean_entropy == pytest.approx(mean, abs=1e-4) and t.fired is fires


def test_trigger_with_short_history_uses_what_exists():
    t = entropy_trigger([0.2], TriggerConfig())
    assert t.k_star == 1 and t.fired, "One low entropy must be enough at the start of a turn."
    assert not entropy_trigger([], TriggerConfig()).fired


def test_ema_worked_example_and_draft_length():
    s = ema_update(0.5, 6 / 8, 0.3)
    assert s == pytest.approx(0.575)
    assert draft_length(16, s) == 9
    assert draft_length(4, 0.625) == 3, "Halves round up (pinned)."
    assert draft_length(16, 0.0) == 1, "Draft length never drops below 1."


def _drafter(target, **over):
    cfg = EngineConfig().with_overrides({"method": "respec", "trigger.theta_entropy": 20.0, **over})
    return make_drafter("respec", target, cfg), cfg


def test_every_earlier_position_is_a_candidate_and_trie_merges_them():
    target = make_target("llama")
    d, _ = _drafter(target, **{"candidates.min_match": 2})
    # "5 6 7" occurs three times, followed by 8, 9 and 8 -> trie root(7) -> 8 / 9 branches
    hist = [5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 5, 6, 7, 8, 3, 5, 6]
    d.reset(hist, None)
    prop = d.propose(DraftContext(tokens=hist, root=7, entropies=[0.1, 0.1, 0.1], max_nodes=100))
    ends = sorted(c.end_pos for c in prop.candidates)
    assert ends == [2, 7, 12], f"All earlier match positions must be enumerated, got {ends}."
    assert prop.source == "retrieval"
    firsts = {prop.tree.tokens[c] for c in prop.tree.children()[0]}
    assert firsts == {8, 9}, "Continuations sharing a prefix must merge into one trie."
    assert prop.decision.fired and "retrieval" in prop.decision.reason


def test_trie_order_probability_branches_where_rank_order_fills_one_chain():
    """Three candidates (ends 12, 7, 2; continuations 8 3 5 6 / 9 2 5 ... / 8 1 5 ...) and room for
    3 draft nodes: "rank" (the earlier insertion) spends it all on the best candidate's chain;
    "probability" keeps the likelier first tokens of the others, so the trie branches at the root."""
    target = make_target("llama")
    hist = [5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 5, 6, 7, 8, 3, 5, 6]
    trees = {}
    for order in ("rank", "probability"):
        d, _ = _drafter(target, **{"candidates.min_match": 2, "candidates.tree_budget": 4,
                                   "candidates.trie_order": order})
        d.reset(hist, None)
        prop = d.propose(DraftContext(tokens=hist, root=7, entropies=[0.1, 0.1, 0.1], max_nodes=100))
        assert prop.source == "retrieval" and prop.tree.num_draft == 3
        trees[order] = prop.tree
        proposed = [c.proposed for c in prop.candidates if c.draft is not None]
        if order == "rank":
            assert list(prop.tree.tokens) == [7, 8, 3, 5] and list(prop.tree.parents) == [-1, 0, 1, 2]
            assert sum(p > 0 for p in proposed) == 2     # e=2 shares only the first token, 8
        else:
            assert {prop.tree.tokens[c] for c in prop.tree.children()[0]} == {8, 9}
            assert sum(p > 0 for p in proposed) == 3
    with pytest.raises(ConfigError):
        EngineConfig().with_overrides({"candidates.trie_order": "breadth"})


def test_low_scores_fall_back_to_eagle_with_a_reason():
    target = make_target("llama")
    d, _ = _drafter(target, **{"candidates.min_match": 2, "candidates.s0": 0.2})
    hist = [5, 6, 7, 8, 1, 5, 6]
    d.reset(hist, target.prefill(hist).hidden)
    prop = d.propose(DraftContext(tokens=hist, root=7, entropies=[0.1], max_nodes=100))
    assert prop.source == "eagle" and "fallback" in prop.decision.reason
    assert prop.candidates and not prop.candidates[0].qualified


def test_no_trigger_means_eagle():
    target = make_target("llama")
    cfg = EngineConfig().with_overrides({"method": "respec", "trigger.theta_entropy": 0.0})
    d = make_drafter("respec", target, cfg)
    hist = [5, 6, 7, 8, 5, 6]
    d.reset(hist, target.prefill(hist).hidden)
    prop = d.propose(DraftContext(tokens=hist, root=7, entropies=[3.0, 2.0], max_nodes=100))
    assert prop.source == "eagle" and prop.decision.fired is False


def test_ema_updates_and_inheritance_through_the_engine():
    """On repeated text the copied span's successor position inherits the score of its predecessor."""
    target = make_target("llama", seed=3)
    ref = run(target, "vanilla", [5, 6, 7, 8, 9, 10, 11], max_new_tokens=40)
    prompt = [5, 6, 7, 8, 9, 10, 11] + list(ref.tokens[:39]) + [5, 6, 7, 8, 9, 10, 11]
    r = run(target, "respec", prompt, max_new_tokens=40,
            **{"trigger.theta_entropy": 20.0, "candidates.l_max": 4, "relax.budget": 0})
    assert r.tokens == run(target, "vanilla", prompt, max_new_tokens=40).tokens
    retrieval = [s for s in r.steps if s.source == "retrieval"]
    assert retrieval, "Retrieval must fire on repeated text."
    counted = 0
    for s in retrieval:
        accepted_path = [s.tree.tokens[n] for n in s.verdict.path[1:]]
        best = 0
        for c in s.candidates:
            if "draft" not in c:
                continue
            # independent recount: proposed = the deepest trie node whose root path spells a prefix of
            # the candidate's draft; accepted = that prefix's agreement with the verified path
            proposed = _deepest_prefix_in_tree(s.tree, c["draft"])
            accepted = _common(c["draft"][:proposed], accepted_path)
            assert c.get("proposed", 0) == proposed, f"step {s.step}: proposed count of e={c['end_pos']}"
            if proposed:
                assert c["accepted"] == accepted, f"step {s.step}: accepted count of e={c['end_pos']}"
                want = 0.7 * c["score_before"] + 0.3 * accepted / proposed
                assert c["score_after"] == pytest.approx(want), "EMA update S <- (1-α)S + αR."
                counted += 1
                best = max(best, accepted)
        assert best == s.num_accepted, "every accepted trie node lies on some candidate's draft"
    assert counted and any(c.get("accepted") for s in retrieval for c in s.candidates), \
        "the run must exercise accepted retrieval drafts"
    inherited = [c for s in retrieval for c in s.candidates if c["inherited_from"] is not None]
    assert inherited, "A position continuing an accepted span must inherit its predecessor's score."


def _deepest_prefix_in_tree(tree, draft) -> int:
    best = 0
    for v in range(1, tree.size):
        path = [tree.tokens[u] for u in tree.path_to(v)[1:]]
        if path == list(draft[:len(path)]):
            best = max(best, len(path))
    return best


def _common(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_relaxed_budget_never_exceeded_and_specials_never_relaxed():
    target = make_target("qwen2", seed=5)
    base = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    prompt = base + [20, 21] + base[:-3] + [30] + base[:4]
    for budget in (1, 2, 3):
        r = run(target, "respec", prompt, max_new_tokens=40,
                **{"trigger.theta_entropy": 20.0, "relax.budget": budget, "relax.beta": 128, "relax.tau": 50.0,
                   "relax.lookahead": 1, "candidates.min_match": 2})
        assert r.stats.relaxed_tokens > 0, f"budget {budget}: the run must relax something, or nothing is tested"
        assert r.stats.relaxed_tokens == sum(s.verdict.num_relaxed for s in r.steps)
        for s in r.steps:
            assert s.verdict.num_relaxed <= budget, "Relaxed acceptances per step must respect the budget."
            for node, st in enumerate(s.verdict.node_status):
                if st == "relaxed":
                    assert s.tree.sources[node] == "retrieval", "Only retrieved nodes may be relaxed."
                    assert s.tree.tokens[node] not in target.eos_token_ids
