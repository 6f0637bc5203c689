"""ReSpec's ablations (issue 18): each removes one part, and only that part. respec-no-gate retrieves
whenever a match of L_min exists; respec-no-feedback keeps the candidate set and K but ranks by match
length then recency with every score fixed at S0; respec-no-model never lets EAGLE-2 draft. Which
methods relax (RELAXED_METHODS / is_lossless), and the legacy names still load."""
import pytest

from respec.config import LEGACY_METHODS, METHOD_INFO, METHODS, RELAXED_METHODS, EngineConfig, is_lossless
from respec.drafters import make_drafter
from respec.drafters.base import DraftContext
from respec.drafters.respec import VARIANTS, draft_length
from respec.trace import result_from_json, result_to_json
from tests.conftest import make_target, run

# "5 6 7" ends at 2 and 12 (match 3 with the root 7), "6 7" at 7 (match 2)
HIST = [5, 6, 7, 8, 1, 9, 6, 7, 9, 2, 5, 6, 7, 3, 4, 5, 6]


def _drafter(method, target, **over):
    cfg = EngineConfig().with_overrides({"method": method, "candidates.min_match": 2, **over})
    return make_drafter(method, target, cfg), cfg


@pytest.mark.parametrize("method", METHODS)
def test_every_method_is_documented_and_relaxes_exactly_when_it_should(method):
    assert METHOD_INFO[method]
    relaxed = method.startswith("respec") and method != "respec-strict"
    assert (method in RELAXED_METHODS) is relaxed
    cfg = EngineConfig(method=method)
    assert is_lossless(cfg) is not relaxed, "relax.budget 2, greedy: only the relaxed methods are lossy"
    assert is_lossless(cfg.with_overrides({"relax.budget": 0}))
    assert is_lossless(cfg.with_overrides({"sampling.temperature": 0.7})), "sampling is always lossless"
    if method.startswith("respec"):
        assert method in VARIANTS


def test_legacy_names_still_load_and_name_their_successors():
    assert set(LEGACY_METHODS) == {"respec-no-trigger", "respec-no-ema"}
    assert set(LEGACY_METHODS.values()) <= set(METHODS)
    target = make_target("llama")
    for method in LEGACY_METHODS:
        r = run(target, method, HIST, max_new_tokens=6)
        again = result_from_json(result_to_json(r))
        assert again.config.method == method and again.tokens == r.tokens


def test_no_gate_retrieves_on_a_match_where_the_gate_would_not_fire():
    target = make_target("llama")
    ctx = DraftContext(tokens=HIST, root=7, entropies=[3.0, 3.0, 3.0], max_nodes=100)
    d, _ = _drafter("respec-no-gate", target, **{"trigger.theta_entropy": 0.5})
    d.reset(HIST, target.prefill(HIST).hidden)
    prop = d.propose(ctx)
    assert prop.source == "retrieval" and prop.decision.fired
    assert prop.decision.extra["gate_would_fire"] is False and "no entropy gate" in prop.decision.reason
    gated, _ = _drafter("respec", target, **{"trigger.theta_entropy": 0.5})
    gated.reset(HIST, target.prefill(HIST).hidden)
    g = gated.propose(ctx)
    assert g.source != "retrieval" and g.decision.fired is False, "the control: ReSpec's gate is closed here"
    # without a match of L_min the ablation does not retrieve either
    d.reset(HIST, target.prefill(HIST).hidden)
    none = d.propose(DraftContext(tokens=HIST, root=99, entropies=[3.0], max_nodes=100))
    assert none.source != "retrieval" and "L_min" in none.decision.reason


def test_no_feedback_ranks_by_match_then_recency_without_a_score_filter():
    target = make_target("llama")
    over = {"trigger.theta_entropy": 20.0, "candidates.s0": 0.2, "candidates.top_k": 2, "candidates.l_max": 10}
    ctx = DraftContext(tokens=HIST, root=7, entropies=[0.1], max_nodes=100)
    d, cfg = _drafter("respec-no-feedback", target, **over)
    d.reset(HIST, target.prefill(HIST).hidden)
    prop = d.propose(ctx)
    assert prop.source == "retrieval", "S0 0.2 < θ_score 0.5, yet no score filter applies"
    assert [c.end_pos for c in prop.candidates] == [12, 2, 7], "match length first, then the most recent"
    assert all(c.qualified and c.score_before == 0.2 for c in prop.candidates)
    n = draft_length(10, 0.2)
    assert [list(c.draft) for c in prop.candidates[:2]] == [HIST[13:13 + n], HIST[3:3 + n]]
    assert prop.candidates[2].draft is None, "K = 2 candidates, as ReSpec would take"
    assert {prop.tree.tokens[c] for c in prop.tree.children()[0]} == {3, 8}
    full, _ = _drafter("respec", target, **over)
    full.reset(HIST, target.prefill(HIST).hidden)
    assert full.propose(ctx).source != "retrieval", "the control: ReSpec's score filter refuses S0 = 0.2"


def test_no_feedback_never_updates_scores_and_stays_lossless_at_budget_zero():
    target = make_target("llama", seed=3)
    ref = run(target, "vanilla", [5, 6, 7, 8, 9, 10, 11], max_new_tokens=30)
    prompt = [5, 6, 7, 8, 9, 10, 11] + list(ref.tokens[:29]) + [5, 6, 7, 8, 9, 10, 11]
    over = {"trigger.theta_entropy": 20.0, "candidates.min_match": 2, "relax.budget": 0}
    cfg = EngineConfig().with_overrides({"method": "respec-no-feedback", **over})
    d = make_drafter("respec-no-feedback", target, cfg)
    r = run(target, "respec-no-feedback", prompt, drafter=d, max_new_tokens=30, **over)
    assert r.tokens == run(target, "vanilla", prompt, max_new_tokens=30).tokens
    records = [c for s in r.steps if s.source == "retrieval" for c in s.candidates]
    assert records and any(c.get("accepted") for c in records), "retrieval must fire and be accepted"
    assert all(c["score_before"] == cfg.candidates.s0 and c.get("score_after") is None for c in records)
    assert all(c["inherited_from"] is None for c in records)
    assert d.scores == {} and d.pred_of == {}, "no feedback: no EMA state at all"


def test_no_model_never_drafts_with_eagle():
    target = make_target("llama", seed=3)
    d, cfg = _drafter("respec-no-model", target, **{"trigger.theta_entropy": 0.5})
    assert d.eagle is None and d.needs_hidden is False
    d.reset(HIST, None)
    prop = d.propose(DraftContext(tokens=HIST, root=7, entropies=[3.0], max_nodes=100))
    assert prop.source == "none" and prop.tree.size == 1 and "no model fallback" in prop.decision.reason
    ref = run(target, "vanilla", [5, 6, 7, 8, 9, 10, 11], max_new_tokens=30)
    prompt = [5, 6, 7, 8, 9, 10, 11] + list(ref.tokens[:29]) + [5, 6, 7, 8, 9, 10, 11]
    over = {"trigger.theta_entropy": 20.0, "candidates.min_match": 2, "relax.budget": 0}
    r = run(target, "respec-no-model", prompt, max_new_tokens=30, **over)
    assert r.tokens == run(target, "vanilla", prompt, max_new_tokens=30).tokens
    sources = {s.source for s in r.steps}
    assert "eagle" not in sources and "retrieval" in sources
    assert all(s.tree.size == 1 for s in r.steps if s.source == "none")
