"""The one cost model every drafter uses (respec/cost.py): sizes chosen against synthetic verify-cost
curves and acceptances, the request's cost correction, the retrieval continuation estimate, tries
that branch by score, and a head that does not pay being switched off with cheap probes."""
import math
import random

import pytest

from respec.cost import (FIRST_PLAIN, MIN_GAIN, OFFSET_WINDOW, PLAIN_EVERY, ContinuationEstimator, CostModel, SizePlan, ancestor_closed_order,
                         interpolate_cost, plan_size, trie_node_probs)
from respec.drafters.eagle2 import DEPTH_SOURCE, ROOT_SOURCE
from respec.tree import DraftTree
from tests.conftest import inject_costs, make_target, run

AMX = {1: 50.0, 2: 50.0, 4: 51.0, 8: 55.0, 16: 70.0, 32: 100.0}       # flat: 16 tokens ≈ 1.4 steps
NO_AMX = {1: 50.0, 2: 56.0, 4: 62.0, 8: 75.0, 16: 100.0, 32: 150.0}   # steep: 16 tokens = 2 steps


def small_auto_drafter(target):
    """An auto-budget EAGLE drafter with a random head (at most 8 nodes, depth 2, top-k 2)."""
    from respec.config import TreeConfig
    from respec.drafters.eagle2 import Eagle2Drafter
    from respec.drafters.heads.eagle import random_head
    return Eagle2Drafter(target, random_head(target), TreeConfig(total_tokens=8, depth=2, top_k=2, auto=True))


def test_worked_example_keeps_a_confident_chain_and_drops_hopeless_nodes():
    plan = plan_size([.9, .8, .7, 1e-4, 1e-4], AMX)
    assert plan.size == 4 and plan.of == 6
    assert plan.expected_tokens == pytest.approx(3.4)
    assert plan.rate_vs_plain == pytest.approx(3.4 / 51.0 * 50.0)
    assert plan_size([1e-3, 1e-3], AMX).size == 1, "A useless draft must be dropped entirely."
    none = plan_size([], AMX)
    assert none.size == 1 and none.rate_vs_plain == pytest.approx(1.0) and not none.pays


def test_the_same_acceptance_buys_a_shorter_draft_where_verification_is_dearer():
    chain = [0.8 ** i for i in range(1, 16)]
    flat, steep = plan_size(chain, AMX), plan_size(chain, NO_AMX)
    assert steep.size < flat.size, (flat, steep)
    assert flat.pays and steep.pays
    # drafting time counts: a draft that costs two plain steps to make does not pay
    assert plan_size([.9, .8, .7], AMX, draft_ms=120.0).rate_vs_plain < 1.0


def test_plan_is_the_best_prefix_by_brute_force():
    rng = random.Random(0)
    for _ in range(200):
        sizes = sorted(rng.sample(range(2, 64), 5))
        curve, c = {1: 40.0 + rng.random() * 20}, None
        for n in sizes:
            c = curve[max(curve)] + rng.random() * 20
            curve[n] = c
        probs = sorted((rng.random() ** 2 for _ in range(rng.randrange(0, 40))), reverse=True)
        plan = plan_size(probs, curve, draft_ms=rng.random() * 10)
        rates = [(1 + sum(probs[:k])) / interpolate_cost(curve, k + 1) for k in range(len(probs) + 1)]
        assert rates[plan.size - 1] * (1 + MIN_GAIN) >= max(rates) - 1e-12
        assert plan.expected_tokens == pytest.approx(1 + sum(probs[:plan.size - 1]))
        assert plan_size(probs, curve, max_size=3).size <= 3


def test_cost_model_shifts_the_curve_to_the_request_and_takes_median_draft_times():
    cm = CostModel(lambda n: dict(AMX), max_size=16)
    assert cm.context_offset_ms == 0.0 and cm.plain_ms() == 50.0
    for size, ms in [(1, 250.0), (16, 270.0), (4, 251.0), (1, 5000.0), (8, 255.0), (1, 249.0)]:
        cm.observe(size, ms)
    assert cm.context_offset_ms == pytest.approx(200.0), "median residual"
    assert cm.offset_ms("one") == pytest.approx(200.0), "median residual, robust to the outlier"
    assert cm.curve()[16] == pytest.approx(270.0) and cm.plain_ms() == pytest.approx(250.0)
    # at the long context the same chain pays more: verification there is relatively cheaper
    assert cm.plan("retrieval", [.9, .8, .7]).rate_vs_plain > plan_size([.9, .8, .7], AMX).rate_vs_plain
    for _ in range(OFFSET_WINDOW):
        cm.observe(1, 0.0)
    assert cm.offset_ms("one") == pytest.approx(-25.0), "a faster context never lowers costs below half"
    assert cm.context_offset_ms == pytest.approx(200.0), "trees keep their own shift"
    assert cm.draft_ms("eagle", 150.0) == 150.0
    assert [cm.draft_ms("eagle", ms) for ms in (0.0, 0.0, 0.0, 0.0, 900.0)][-1] == 0.0
    assert cm.draft_ms("retrieval") == 0.0, "sources keep separate drafting times"


def test_one_token_steps_and_trees_are_shifted_apart():
    """A long context that adds 3 ms to a one-token step and 9 ms to a tree (the compiled default
    model over a long prompt): plain steps are priced at their own shift, so a draft that would
    pay against plain steps priced at the trees' shift (1.25 tokens for 67 ms against one for
    59 ms) is refused against their real price (one for 53 ms)."""
    cm = CostModel(lambda n: dict(NO_AMX), max_size=16)
    for _ in range(3):
        cm.observe(1, 53.0)
    assert cm.curve()[4] == pytest.approx(65.0), "no tree seen yet: the one-token shift"
    for _ in range(OFFSET_WINDOW):
        cm.observe(2, 65.0)
    assert cm.plain_ms() == pytest.approx(53.0) and cm.curve()[2] == pytest.approx(65.0)
    assert cm.plan("eagle", [0.25], draft_ms=2.0).size == 1, "not drafted"
    assert SizePlan.at([0.25], 2, cm.curve(), 2.0).rate_vs_plain == pytest.approx(1.25 * 53.0 / 67.0)
    assert (1.25 / 67.0) * 59.0 > 1.02, "the same draft against plain steps at the trees' shift"


def test_trees_at_every_step_leave_room_for_a_plain_step_that_prices_plain_steps():
    """Only trees timed: plain steps are priced at the trees' shift until a one-token step is timed,
    which the cost model asks for after FIRST_PLAIN trees, and again after PLAIN_EVERY in a row."""
    cm = CostModel(lambda n: dict(NO_AMX), max_size=16)
    assert not cm.wants_plain_step()
    for _ in range(FIRST_PLAIN):
        assert not cm.wants_plain_step()
        cm.observe(4, 70.0)
    assert cm.wants_plain_step() and cm.plain_ms() == pytest.approx(58.0), "priced at the trees' +8 ms"
    cm.observe(1, 52.0)
    assert not cm.wants_plain_step() and cm.plain_ms() == pytest.approx(52.0)
    for _ in range(PLAIN_EVERY - 1):
        cm.observe(4, 70.0)
    assert not cm.wants_plain_step()
    cm.observe(8, 83.0)
    assert cm.wants_plain_step()


def test_the_eagle_drafter_leaves_a_plain_step_when_the_cost_model_asks_and_stays_lossless(monkeypatch):
    monkeypatch.setattr(CostModel, "wants_plain_step", lambda self: True)
    target = make_target("llama", seed=0)
    prompt = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 4
    ref = run(target, "vanilla", prompt, max_new_tokens=24)
    out = run(target, "eagle2", prompt, max_new_tokens=24, **{"tree.auto": True, "tree.total_tokens": 8})
    assert out.tokens == ref.tokens
    assert all(s.num_draft == 0 for s in out.steps), "no draft while a plain step is wanted"
    reasons = [s.decision.reason for s in out.steps if s.decision is not None]
    assert any("a plain step, to time one" in r for r in reasons), reasons[:3]


def test_trie_probabilities_chain_split_siblings_and_ancestor_closed_order():
    chain = trie_node_probs([-1, 0, 1, 2], [1, 1, 1, 1], 0.5)
    assert chain == pytest.approx([1, .5, .25, .125])
    # root -> 1 -> 2 -> 3 (candidate score .6) ; root -> 4 -> 5 (candidate score .4)
    tree = DraftTree.trie(9, [[1, 2, 3], [4, 5]], budget=10, path_scores=[0.6, 0.4])
    probs = trie_node_probs(tree.parents, tree.scores, 0.7)
    kids = [i for i in range(1, tree.size) if tree.parents[i] == 0]
    assert sum(probs[k] for k in kids) == pytest.approx(0.7)
    assert probs[kids[0]] == pytest.approx(0.7 * 0.6) and probs[kids[1]] == pytest.approx(0.7 * 0.4)
    order = ancestor_closed_order(tree.parents, probs)
    for k in range(len(order) + 1):
        tree.subtree(order[:k])          # raises if a prefix is not ancestor-closed
    # the second candidate's first token is likelier than the first candidate's third: it branches
    assert order.index(kids[1]) < order.index(3)


def test_subtree_refuses_a_node_without_its_parent():
    tree = DraftTree.chain(1, [2, 3, 4], "retrieval")
    assert tree.subtree([1, 2]).tokens == (1, 2, 3)
    with pytest.raises(ValueError, match="ancestor-closed"):
        tree.subtree([2])


def test_continuation_estimator_counts_trials_along_the_accepted_path():
    est = ContinuationEstimator(prior=0.6, prior_weight=4.0, decay=1.0)
    parents = [-1, 0, 1, 2, 3]                              # a chain of 4 draft tokens
    est.update(8, parents, [0, 1, 2])                       # 2 accepted, rejected at the third
    assert est.rate(8) == pytest.approx((2 + 2.4) / (3 + 4))
    est.update(8, parents, [0, 1, 2, 3, 4])                 # all 4 accepted: 4 trials, 4 successes
    assert est.rate(8) == pytest.approx((6 + 2.4) / (7 + 4))
    assert est.rate(2) == pytest.approx(0.6), "other match-length buckets keep their prior"
    assert est.rate(9) == est.rate(8)


def test_a_random_head_is_switched_off_at_its_first_probe_and_stays_lossless(monkeypatch):
    """A useless head costs a plain step: it never grows a tree, and probes (catch-up only) get
    rarer and rarer. Costs are injected (NO_AMX, a 5 ms head row), so the verdict is the same on
    every machine."""
    target = make_target("llama", seed=0)
    inject_costs(monkeypatch, target, NO_AMX, row_ms=5.0)
    prompt = [5, 17, 33, 9, 71, 4, 88, 12] * 3
    ref = run(target, "vanilla", prompt, max_new_tokens=80)
    out = run(target, "eagle2", prompt, max_new_tokens=80, **{"tree.auto": True, "tree.total_tokens": 16,
                                                               "tree.depth": 3, "tree.top_k": 4})
    assert out.tokens == ref.tokens
    assert out.stats.steps_by_source.get("eagle", 0) == 0, "A head that accepts nothing must not draft."
    probes = [s for s in out.steps if s.decision is not None and "auto probe" in s.decision.reason]
    assert 1 <= len(probes) <= 5, len(probes)          # back-off 4, 16, 64 steps
    cost = probes[0].decision.extra["cost"]
    assert cost["rate_vs_plain"] < 1.0 and cost["probe_rows"] >= 1


def test_a_head_switched_off_in_one_request_backs_off_further_in_the_runners_next(monkeypatch):
    """respec/memory.py HeadBackoff: a random head refused in one request leaves the runner's
    record off with its misses; the next request (same method, same forward) still probes first,
    but its refusal sits out 2^(misses + 1) steps rather than starting again at 4; without a
    memory, and for another method or the other forward, nothing carries. Costs injected; output
    stays vanilla's."""
    from respec.config import EngineConfig
    from respec.drafters import make_drafter
    from respec.engine import Engine
    from respec.memory import RunnerMemory
    target = make_target("llama", seed=0)
    inject_costs(monkeypatch, target, NO_AMX, row_ms=5.0)
    prompt = [5, 17, 33, 9, 71, 4, 88, 12] * 3
    ref = run(target, "vanilla", prompt, max_new_tokens=4)
    cfg = EngineConfig().with_overrides({"method": "eagle2", "max_new_tokens": 4, "tree.auto": True,
                                         "tree.total_tokens": 16, "tree.depth": 3, "tree.top_k": 4})
    memory = RunnerMemory()

    def first_probe(mem) -> str:
        out = Engine(target, make_drafter("eagle2", target, cfg, memory=mem), cfg).generate(prompt)
        assert out.tokens == ref.tokens
        assert "auto probe" in out.steps[0].decision.reason          # every request probes first
        return out.steps[0].decision.reason

    assert "head off for 4 steps" in first_probe(memory)          # 0 of many rows: two misses
    record = memory.head_backoff("eagle2", forward="eager")
    assert record.off and record.misses == 2
    assert "head off for 16 steps" in first_probe(memory)         # the misses went on: 4
    assert memory.head_backoff("eagle2", forward="eager").misses == 4
    assert "head off for 4 steps" in first_probe(None)            # no memory: nothing carried
    assert not memory.head_backoff("sam", forward="eager").off and not memory.head_backoff("eagle2", "compiled").off


def test_a_head_that_predicts_well_passes_its_probe_and_drafts():
    target = make_target("llama", seed=0)
    d = small_auto_drafter(target)
    cm = CostModel(lambda n: dict(AMX), max_size=8)
    d._hits, d._rows = 15, 16
    assert d._probe_refusal(cm) is None, "15 of 16 right: a one-token draft pays"
    d._hits, d._rows = 0, 16
    refusal = d._probe_refusal(cm)
    assert refusal is not None and d._skip == 4 and refusal.kept == 1, "0 of 16: back off fast"
    assert refusal.to_dict()["kept"] == 1, "the trace records the head switched off"
    d._hits, d._rows = 1, 16
    cm.draft_ms(ROOT_SOURCE, 5.0)                  # the request's draft starts take 5 ms
    assert d._probe_refusal(cm) is not None and d._skip == 8, "1 of 16 does not pay for a 5 ms draft"


def test_a_first_probe_refused_on_the_prompt_waits_for_the_answer_without_a_miss():
    """A request's first probe is judged on its prompt, which a head trained on answers predicts
    worse (commit 63792de of 2026-12-05: 0.16 against 0.36 of rows): refused with some matches, the head sits out
    PROBE_ROWS steps with its carried misses untouched, so the next probe judges the answer's own
    rows; then it backs off as before. A head matching nothing backs off at once."""
    from respec.drafters.eagle2 import PROBE_ROWS
    target = make_target("llama", seed=0)
    d = small_auto_drafter(target)
    cm = CostModel(lambda n: dict(NO_AMX), max_size=8)
    cm.draft_ms(ROOT_SOURCE, 5.0)
    d._misses = 3                                  # carried from the runner's last request
    d._hits, d._rows = 2, 16
    assert d._probe_refusal(cm) is not None and d._skip == PROBE_ROWS and d._misses == 3
    d._hits, d._rows = 2, 16                       # the answer's rows: refused again, a miss
    assert d._probe_refusal(cm) is not None and d._misses == 4 and d._skip == 16
    d._reset_auto()
    d._hits, d._rows = 0, 16                       # nothing matched at the first probe: no waiting
    assert d._probe_refusal(cm) is not None and d._misses == 2 and d._skip == 4


def test_a_probe_charges_a_one_row_draft_not_its_own_catch_up(monkeypatch):
    """A probe's catch-up (a long prompt, a long sit-out) is paid once; what a one-token draft costs
    from then on is a draft's start: the request's median one (a step's catch-up and the root's
    logits), else the head's row cost; a tree layer's time does not stand in for it."""
    from respec.config import TreeConfig
    from respec.drafters.eagle2 import Eagle2Drafter
    from respec.drafters.heads.eagle import random_head
    target = make_target("llama", seed=0)
    head = random_head(target)
    ms = head.row_ms(target)
    assert 0.0 < ms < 1000.0 and head.row_ms(target) == ms, "timed once per head and target, then cached"
    d = Eagle2Drafter(target, head, TreeConfig(total_tokens=8, depth=2, top_k=2, auto=True))
    cm = CostModel(lambda n: dict(NO_AMX), max_size=8)
    monkeypatch.setattr(head, "row_ms", lambda t: 3.0)
    d._hits, d._rows = 8, 16
    plan = d._one_token_plan(cm)
    assert plan.cost_ms == pytest.approx(NO_AMX[2] + 3.0) and plan.expected_tokens == pytest.approx(1 + 8 / 18)
    cm.draft_ms(DEPTH_SOURCE, 9.0)
    assert d._one_token_plan(cm).cost_ms == pytest.approx(NO_AMX[2] + 3.0), "a tree layer is not what one token costs"
    cm.draft_ms(ROOT_SOURCE, 6.0)
    assert d._one_token_plan(cm).cost_ms == pytest.approx(NO_AMX[2] + 6.0), "a timed draft start replaces the row cost"
    d._hits = 0
    assert d._one_token_plan(cm).cost_ms == pytest.approx(NO_AMX[2]), "no hits: refused without timing anything"


def test_cost_model_drives_every_method_and_the_trace_records_prediction_and_outcome():
    target = make_target("qwen2", seed=1)
    prompt = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 4
    ref = run(target, "vanilla", prompt, max_new_tokens=40)
    for method in ("sam", "respec-strict", "eagle2"):
        out = run(target, method, prompt, max_new_tokens=40,
                  **{"tree.auto": True, "tree.total_tokens": 8, "sam.n_predicts": 15, "sam.len_threshold": 2,
                     "candidates.tree_budget": 16, "candidates.min_match": 2, "trigger.theta_entropy": 20.0})
        assert out.tokens == ref.tokens, method
        costs = [s.decision.extra["cost"] for s in out.steps if s.decision and "cost" in s.decision.extra]
        assert costs, f"{method}: every planned step records its prediction"
        for c in costs:
            assert c["kept"] >= 1 and "expected_tokens" not in c or c["expected_tokens"] >= 1.0


def test_a_probe_over_a_long_queue_checks_the_tail_only_and_feeds_the_queue_only_if_it_passes(monkeypatch):
    import respec.drafters.eagle2 as eagle2
    from respec.drafters.eagle2 import SCRATCH_WINDOW
    target = make_target("llama", seed=0)
    monkeypatch.setattr(eagle2, "SCRATCH_QUEUE", SCRATCH_WINDOW)   # a long queue within the tiny model's context
    prompt = [(7 * i) % 90 + 3 for i in range(SCRATCH_WINDOW + 40)]
    hidden = target.prefill(prompt).hidden
    d = small_auto_drafter(target)
    cm = CostModel(lambda n: dict(NO_AMX), max_size=8)
    d.reset(prompt, hidden)
    tree = d.draft_tree(prompt, 5, cost=cm).tree
    assert tree.size == 1 and d.kv_len == 0, "a failed probe must not feed the head the whole prompt"
    assert d._rows == 16 and sum(p.shape[0] for p in d._pending) == len(prompt), "the queue is kept"
    d.reset(prompt, hidden)
    monkeypatch.setattr(d, "scratch_check", lambda committed, root: setattr(d, "_hits", 3) or setattr(d, "_rows", 16))
    monkeypatch.setattr(d, "_probe_refusal", lambda cost: None)
    tree = d.draft_tree(prompt, 5, cost=cm).tree
    assert d.kv_len == len(prompt) and not d._pending, "a head with hits is fed the whole queue, then drafts"
    assert d._rows == 16, "and judged again with its full context"


def test_a_probe_refuses_a_useless_head_from_a_small_vocabulary_bound_without_the_output_layer(monkeypatch):
    """The probe's first count is an upper bound from a few hundred output rows; a head refused by it
    never runs the whole (draft) output layer, and a bound that could pay is checked exactly."""
    from respec.drafters.eagle2 import PROBE_ROWS
    target = make_target("llama", seed=0)
    prompt = [(5 * i) % 90 + 3 for i in range(40)]
    d = small_auto_drafter(target)
    rows_through_full_layer = []
    full = d.head.draft_logits
    monkeypatch.setattr(d.head, "draft_logits", lambda t, out: rows_through_full_layer.append(out.shape[0]) or full(t, out))
    d.reset(prompt, target.prefill(prompt).hidden)
    d.catch_up(prompt, 7, check=True)
    bound, (rows, truth) = d._hits, d._check
    assert d._rows == PROBE_ROWS and rows.shape[0] == PROBE_ROWS and rows_through_full_layer == [1], \
        "the catch-up runs the full layer on the root's row only"
    top = full(target, rows).float().argmax(-1).tolist()
    exact = sum(int(a == b) for a, b in zip(top, truth))
    assert bound >= exact, "a bound over a vocabulary subset can only over-count"
    cm = CostModel(lambda n: dict(AMX), max_size=8)
    d._hits = 0                                    # what a useless head's bound gives
    assert d._probe_refusal(cm) is not None and rows_through_full_layer == [1], "refused on the bound alone"
    d._check, d._hits, d._rows = (rows, truth), PROBE_ROWS, PROBE_ROWS   # a bound that would pay
    d._probe_refusal(cm)
    assert rows_through_full_layer[-1] == PROBE_ROWS and d._hits == exact, "then the exact count decides"


def test_check_vocab_holds_the_tokens_to_match_and_only_draftable_ids():
    import torch
    from respec.drafters.probe import check_vocab
    ids = check_vocab(100, [11, 12], [40, 41, 41])
    assert {11, 12, 40, 41} <= set(ids.tolist()) and ids.tolist() == sorted(set(ids.tolist()))
    assert set(check_vocab(100, [11, 12], [40, 41], torch.tensor([11, 40, 77])).tolist()) <= {11, 40, 77}


def test_the_depth_cut_stops_growing_a_tree_whose_next_layer_cannot_pay():
    """expand_tree asks the rule before each layer; the drafter's rule compares the frontier's
    calibrated mass per layer-millisecond with the best rate the nodes so far reach."""
    import torch
    from respec.config import TreeConfig
    from respec.drafters.eagle2 import DEPTH_SOURCE, Eagle2Drafter, expand_tree
    from respec.drafters.heads.eagle import random_head
    V = 6
    calls = []

    def step_fn(feats, tokens, depth, parent_slots):
        calls.append(depth)
        return feats, torch.log_softmax(torch.zeros(len(tokens), V), -1)
    root_logp = torch.log_softmax(torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0, -2.0]), -1)
    cfg = TreeConfig(top_k=2, depth=4, total_tokens=16, auto=True)
    tree = expand_tree(step_fn, 99, torch.zeros(4), root_logp, cfg, expand=lambda scores, frontier: len(scores) < 4)
    assert calls == [0] and max(tree.depths()) == 2, "one layer grown, then the rule stopped it"

    target = make_target("llama", seed=0)
    d = Eagle2Drafter(target, random_head(target), cfg)
    d.clock = lambda: 0.0                                            # no drafting time spent so far
    cm = CostModel(lambda n: dict(AMX), max_size=16)
    rule = d._expand_rule(cm, cfg, 0.0)
    assert rule([-0.1], [-0.1]), "no layer timed yet: grow"
    cm.draft_ms(DEPTH_SOURCE, 4.0)
    confident, unsure = [math.log(0.9), math.log(0.8)], [math.log(0.01), math.log(0.005)]
    assert rule(confident, confident), "a frontier likely to be accepted is worth a 4 ms layer"
    assert not rule(confident + unsure, unsure), "1.5% of a token is not worth 4 ms"
    cm.draft_ms(DEPTH_SOURCE, 0.01)
    cm.draft_ms(DEPTH_SOURCE, 0.01)
    assert not rule(confident + unsure, unsure), "nor a free layer: its node needs a verify slot (0.5 ms here)"
    free = CostModel(lambda n: {1: 50.0, 64: 50.0}, max_size=16)      # verifying 64 tokens costs what one does
    for _ in range(3):
        free.draft_ms(DEPTH_SOURCE, 0.01)
    assert d._expand_rule(free, cfg, 0.0)(confident + unsure, unsure), \
        "but 1.5% of a token is worth a layer that costs next to nothing where its slot is free"


def test_the_depth_cut_counts_the_verify_cost_of_the_slots_a_layer_needs():
    """Where a two-token forward costs 1.4 one-token forwards (bf16 without dot-product
    instructions), a tree that keeps nothing yet stops instead of growing a layer that could not pay
    for its slot, though the layer alone is cheap against the frontier's mass; the flat curve grows it."""
    from respec.config import TreeConfig
    from respec.cost import interpolate_cost
    from respec.drafters.eagle2 import DEPTH_SOURCE, Eagle2Drafter, layer_rate_bound
    from respec.drafters.heads.eagle import random_head
    steep = {1: 32.5, 2: 46.6, 4: 60.0, 8: 80.0, 16: 110.0}

    def upto16(curve):                                   # [size] -> ms, sizes 0..16
        return [interpolate_cost(curve, n) for n in range(17)]
    weak = [math.log(0.05)] * 4                          # layer 1: nothing worth a slot
    frontier = [0.05] * 4                                # 0.2 tokens for a 3.4 ms layer: 0.059/ms > plain 0.031/ms
    assert sum(frontier) / 3.4 > 1 / 32.5
    assert layer_rate_bound([0.05] * 4, frontier, upto16(steep), 0.0, 3.4, 4) < 1 / 32.5, \
        "but no size pays with its slots, even over 4 layers"
    assert layer_rate_bound([0.05] * 4, frontier, upto16(AMX), 0.0, 3.4, 1) > 1 / 50.0, "where a slot is free it may"
    # a word's first sub-token unsure (0.08), the rest near-certain: each deeper layer adds 0.08 again
    flat_ish = {1: 37.4, 2: 39.3, 4: 40.1, 8: 41.6, 16: 43.2}
    one = layer_rate_bound([], [0.08], upto16(flat_ish), 0.0, 1.8, 1)
    four = layer_rate_bound([], [0.08], upto16(flat_ish), 0.0, 1.8, 4)
    assert one < 1 / 37.4 < four, "one layer's look-ahead would cut the chain; four layers' pay"
    target = make_target("llama", seed=0)
    cfg = TreeConfig(top_k=4, depth=4, total_tokens=16, auto=True)
    d = Eagle2Drafter(target, random_head(target), cfg)
    d.clock = lambda: 0.0                                            # no drafting time spent so far
    for curve, grows in ((steep, False), (AMX, True)):
        cm = CostModel(lambda n, c=curve: dict(c), max_size=16)
        cm.draft_ms(DEPTH_SOURCE, 3.4)
        assert d._expand_rule(cm, cfg, 0.0)(weak, weak) is grows


def test_the_depth_cut_bound_holds_for_any_next_layers_and_values_a_wide_frontier_by_its_best_slots():
    """`layer_rate_bound` stays an upper bound of every tree that keeps nodes of the next layers
    (random trees whose children share at most their parent's probability), yet a frontier's mass
    spread over many nodes is worth only the slots it can fill: where three tokens cost 1.36
    steps (a compiled 2-core CPU forward, commit 63792de of 2026-12-05), a 0.37 node with nine small siblings does
    not grow a last layer, which it did when each layer was valued at the whole frontier's mass."""
    from respec.cost import layer_rate_bound
    rng = random.Random(0)
    compiled = {1: 20.0, 2: 21.5, 4: 27.1, 8: 36.0, 16: 48.0}
    verify = [interpolate_cost(compiled, n) for n in range(17)]
    for _ in range(300):
        old = sorted((rng.uniform(0.01, 0.9) for _ in range(rng.randint(1, 6))), reverse=True)
        frontier = old[:rng.randint(1, len(old))]
        layers, parents = [], frontier
        for _ in range(3):                       # children share at most (strictly less than) their parent's mass
            kids = []
            for p in parents:
                w = [rng.random() + 1e-3 for _ in range(rng.randint(1, 3))]
                kids += [p * rng.uniform(0.0, 0.999) * x / sum(w) for x in w]
            layers.append(kids)
            parents = kids
        spent, layer_ms = rng.uniform(0.0, 6.0), rng.uniform(0.5, 6.0)
        for depth in (1, 2, 3):
            bound = layer_rate_bound(old, frontier, verify, spent, layer_ms, depth)
            pool = sorted([(q, 0) for q in old] + [(q, d + 1) for d in range(depth) for q in layers[d]], reverse=True)
            for s in range(2, 17):               # the best s - 1 nodes: a tree (children < parents)
                kept = pool[:s - 1]
                grown = max(d for _, d in kept)
                if grown >= 1:
                    rate = (1 + sum(q for q, _ in kept)) / (verify[s] + spent + grown * layer_ms)
                    assert rate <= bound + 1e-12, (old, frontier, s, depth)
    wide = [0.37, 0.1, 0.08, 0.06, 0.05, 0.04, 0.03, 0.03, 0.02, 0.02]
    stop_now = 1.37 / (verify[2] + 3.0)
    assert layer_rate_bound(wide, wide, verify, 3.0, 4.0, 1) < stop_now
    assert layer_rate_bound(wide, [sum(wide)], verify, 3.0, 4.0, 1) > stop_now, "the whole mass in one node would"


def test_the_depth_cut_says_why_in_the_decision_and_can_be_switched_off():
    """(Losslessness with the cut, where a real head drafts: tests/test_default_model.py under the
    device defaults.)"""
    from respec.config import TreeConfig
    from respec.drafters.eagle2 import DEPTH_SOURCE, Eagle2Drafter
    from respec.drafters.heads.eagle import random_head
    target = make_target("llama", seed=0)
    prompt = [5, 17, 33, 9, 71, 4, 88, 12] * 3
    cfg = TreeConfig(top_k=4, depth=4, total_tokens=16, auto=True)
    d = Eagle2Drafter(target, random_head(target), cfg)
    d.reset(prompt, target.prefill(prompt).hidden)
    d._probing = False                                  # past its probe: the head drafts
    cm = CostModel(lambda n: dict(AMX), max_size=16)
    cm.draft_ms(DEPTH_SOURCE, 1000.0)                   # a layer dearer than any gain
    draft = d.draft_tree(prompt, 7, cost=cm)
    assert "grown to depth 1 only: another layer would add at most" in draft.auto.reason
    assert draft.tree.size == 1 or max(draft.tree.depths()) == 1
    # tree.depth_cut=false (the ablation): every layer is grown whatever it costs
    from respec.config import EngineConfig
    full_cfg = EngineConfig().with_overrides({"tree.depth": 4, "tree.top_k": 4, "tree.total_tokens": 16,
                                              "tree.auto": True, "tree.depth_cut": False}).tree
    d2 = Eagle2Drafter(target, random_head(target), full_cfg)
    d2.reset(prompt, target.prefill(prompt).hidden)
    d2._probing = False
    draft = d2.draft_tree(prompt, 7, cost=cm)
    assert "grown to depth" not in draft.auto.reason


def test_a_head_that_earns_its_keep_sits_out_no_step_for_a_run_of_unprofitable_drafts():
    """Two unprofitable drafts in a row switch the head off only if its drafting steps have, on
    balance (tokens committed per drafting + verify ms, decayed), run slower than plain steps."""
    from respec.config import TreeConfig
    from respec.drafters.eagle2 import Eagle2Drafter
    from respec.drafters.heads.eagle import random_head
    target = make_target("llama", seed=0)
    cm = CostModel(lambda n: dict(AMX), max_size=8)                  # a plain step: 50 ms
    # worth verifying once drafted (1.5 tokens for one verify), but not worth 40 ms of drafting
    unprofitable = DraftTree.from_parents([5, 6], [-1, 0], "eagle", scores=[0.0, math.log(0.5)])

    def two_misses(tokens: float, ms: float) -> int:
        d = small_auto_drafter(target)
        d._earned_tokens, d._earned_ms = tokens, ms
        for _ in range(2):
            plan = d._plan(unprofitable, cm, draft_ms=40.0).auto.plan
            assert plan.size == 2 and plan.rate_vs_plain < 1.0
        return d._skip

    assert not Eagle2Drafter(target, random_head(target), TreeConfig()).earns_keep(cm), "no drafts yet"
    assert two_misses(30.0, 600.0) == 0, "20 ms per token beats a 50 ms plain step: keep drafting"
    assert two_misses(10.0, 1000.0) == 4, "100 ms per token: sit out 2^2 steps, then probe"


def test_a_tree_cut_to_nothing_counts_as_a_miss_at_the_rate_its_drafting_cost():
    """A tree whose plan keeps no node (priced 1.00x: its drafting is sunk) still paid for that
    drafting: a plain step's token for verify + drafting ms. Two such drafts in a row switch a
    head without earnings off; one far short of a plain step counts twice; a head that earns its
    keep drafts on."""
    from respec.drafters.eagle2 import FAR_SHORT
    target = make_target("llama", seed=0)
    cm = CostModel(lambda n: dict(AMX), max_size=8)                  # a plain step: 50 ms
    hopeless = DraftTree.from_parents([5, 6], [-1, 0], "eagle", scores=[0.0, math.log(0.001)])

    d = small_auto_drafter(target)
    plans = [d._plan(hopeless, cm, draft_ms=10.0).auto.plan for _ in range(2)]
    assert all(p.size == 1 and p.rate_vs_plain == pytest.approx(1.0) for p in plans), "nothing kept: priced 1.00x"
    assert d._misses == 2 and d._skip == 4 and d._probing, "50 / 60 ms = 0.83x twice: off for 2^2 steps"
    far = small_auto_drafter(target)
    far._plan(hopeless, cm, draft_ms=20.0)                             # 50 / 70 ms = 0.71x
    assert 50.0 / 70.0 < FAR_SHORT and far._misses == 2 and far._skip == 4
    earning = small_auto_drafter(target)
    earning._earned_tokens, earning._earned_ms = 30.0, 600.0          # 20 ms per token
    for _ in range(2):
        earning._plan(hopeless, cm, draft_ms=10.0)
    assert earning._misses == 2 and earning._skip == 0, "a head that earns its keep sits out no step"
    free = small_auto_drafter(target)
    free._misses = 1
    free._plan(hopeless, cm, draft_ms=0.0)
    assert free._misses == 0, "no drafting paid: nothing lost"


def test_a_draft_is_judged_at_its_own_drafting_time_not_the_median_its_plan_charges():
    """A plan charges the request's median drafting time (its record); whether the draft paid is
    judged at the step's own, which is sunk and known: on a compiled CPU forward depth-3 trees
    took ~8 ms against a ~5.5 ms median, and heads whose steps ran slower than plain ones drafted
    on (commit 538c1f4 of 2026-12-06)."""
    target = make_target("llama", seed=0)
    good = DraftTree.from_parents([5, 6], [-1, 0], "eagle", scores=[0.0, math.log(0.5)])

    def judged(median_ms: float, own_ms: float) -> tuple[SizePlan, int]:
        cm = CostModel(lambda n: dict(AMX), max_size=8)              # a plain step: 50 ms
        for _ in range(OFFSET_WINDOW):
            cm.draft_ms("eagle", median_ms)
        d = small_auto_drafter(target)
        d._misses = 1
        return d._plan(good, cm, draft_ms=own_ms).auto.plan, d._misses

    plan, misses = judged(median_ms=5.0, own_ms=40.0)                # 1.5 tokens in 90 ms: 0.83x
    assert plan.size == 2 and plan.rate_vs_plain == pytest.approx(1.5 * 50 / 55), "planned at the median"
    assert misses == 2, "ran at 0.83x a plain step: a miss"
    plan, misses = judged(median_ms=40.0, own_ms=5.0)                # 1.5 tokens in 55 ms: 1.36x
    assert plan.rate_vs_plain < 1.0 and misses == 0, "ran at 1.36x: the misses reset"


def test_a_draft_far_below_a_plain_step_counts_twice_and_a_long_catch_up_is_not_charged_to_it():
    """A draft at under FAR_SHORT of a plain step's rate backs a head without earnings off after
    one draft; feeding a queue longer than one step commits (here the prompt, made slow) is paid
    once whatever is drafted, so the first tree's plan is charged its growth only."""
    from respec.config import TreeConfig
    from respec.drafters.eagle2 import FAR_SHORT, Eagle2Drafter
    from respec.drafters.heads.eagle import random_head
    target = make_target("llama", seed=0)
    cm = CostModel(lambda n: dict(AMX), max_size=8)                  # a plain step: 50 ms
    far = DraftTree.from_parents([5, 6], [-1, 0], "eagle", scores=[0.0, math.log(0.5)])
    d = small_auto_drafter(target)
    plan = d._plan(far, cm, draft_ms=80.0).auto.plan                 # 1.5 tokens per 130 ms: 0.58x
    assert plan.rate_vs_plain < FAR_SHORT and d._skip == 4, "one far-short draft: two misses, off for 4 steps"
    # the drafter's clock is injected: it moves only when the catch-up "takes" 300 ms, and a draft's
    # start costs the cost model's median (seeded at 2 ms; a start after a long feed is not timed)
    cm = CostModel(lambda n: dict(AMX), max_size=8)                  # a fresh one: no 80 ms draft in its median
    for _ in range(OFFSET_WINDOW):
        cm.draft_ms(ROOT_SOURCE, 2.0)
    prompt = list(range(3, 40))
    d2 = Eagle2Drafter(target, random_head(target), TreeConfig(total_tokens=4, depth=2, top_k=2, auto=True))
    now = [100.0]                                                    # seconds
    d2.clock = lambda: now[0]
    d2.reset(prompt, target.prefill(prompt).hidden)
    d2._probing = False
    fed = d2.catch_up

    def slow_catch_up(*args, **kwargs):
        now[0] += 0.3
        return fed(*args, **kwargs)
    d2.catch_up = slow_catch_up
    draft = d2.draft_tree(prompt, 7, cost=cm)
    assert now[0] == pytest.approx(100.3), "the catch-up ran once"
    assert d2._drafted_ms == pytest.approx(2.0), "the 300 ms catch-up is not the draft's: a start's 2 ms instead"
    assert cm.draft_ms(ROOT_SOURCE) == pytest.approx(2.0)
    if draft.auto.plan.size > 1:                                     # a tree was kept: its charge shows
        assert draft.auto.plan.cost_ms - interpolate_cost(cm.curve(), draft.auto.plan.size) == pytest.approx(2.0)


def test_the_depth_cut_times_a_drafts_start_and_each_layer_on_the_wall_from_question_to_question():
    """A layer's cost is everything between two of the depth cut's questions (the head's call,
    the search's top-k and read-back, the rule itself: commit 6e56d99 of 2026-12-06 timed the head's call alone,
    3.4 of ~5 ms on a compiled CPU); the first question times a draft's start (a step's catch-up
    and the root's logits, what a one-token draft costs), except after a long feed."""
    from respec.config import TreeConfig
    from respec.drafters.eagle2 import Eagle2Drafter
    from respec.drafters.heads.eagle import random_head
    target = make_target("llama", seed=0)
    cfg = TreeConfig(top_k=2, depth=3, total_tokens=8, auto=True)
    d = Eagle2Drafter(target, random_head(target), cfg)
    ticks = iter([100.004, 100.009, 100.015])
    d.clock = lambda: next(ticks)
    cm = CostModel(lambda n: dict(AMX), max_size=8)
    rule = d._expand_rule(cm, cfg, 100.0)
    for _ in range(3):
        rule([math.log(0.9)], [math.log(0.9)])
    assert cm.draft_ms(ROOT_SOURCE) == pytest.approx(4.0)
    assert cm.draft_ms(DEPTH_SOURCE) == pytest.approx(5.5), "layers of 5 and 6 ms: their median"
    ticks = iter([200.002])
    fresh = CostModel(lambda n: dict(AMX), max_size=8)
    d._expand_rule(fresh, cfg, 200.0, spent_before=1.5)([math.log(0.9)], [math.log(0.9)])
    assert fresh.draft_ms(ROOT_SOURCE) == 0.0, "after a long feed the start is not a step's"


@pytest.mark.parametrize("queued", [3, 40])
def test_the_depth_cut_counts_a_long_feed_as_the_plan_does_not_as_time_spent_on_the_tree(monkeypatch, queued):
    """A queue longer than one step commits (a prompt, a sit-out) is fed whatever is drafted: the
    depth cut's time spent so far starts after that feed, plus one head row (as the plan charges),
    so a sunk feed does not make another layer look cheap. A short queue's catch-up counts."""
    from respec.config import TreeConfig
    from respec.drafters.eagle2 import Eagle2Drafter
    from respec.drafters.heads.eagle import random_head
    target = make_target("llama", seed=0)
    prompt = [(3 * i) % 90 + 3 for i in range(queued)]
    d = Eagle2Drafter(target, random_head(target), TreeConfig(total_tokens=8, depth=3, top_k=2, auto=True))
    d.reset(prompt, target.prefill(prompt).hidden)
    d._probing = False
    now = [100.0]
    monkeypatch.setattr(d, "clock", lambda: now[0])
    feed = d.catch_up
    monkeypatch.setattr(d, "catch_up", lambda *a, **k: (now.__setitem__(0, now[0] + 0.5), feed(*a, **k))[1])
    monkeypatch.setattr(d.head, "row_ms", lambda target, reps=3: 1.25)
    seen = []
    rule = d._expand_rule
    monkeypatch.setattr(d, "_expand_rule", lambda cost, cfg, t0, spent_before=0.0:
                        seen.append((t0, spent_before)) or rule(cost, cfg, t0, spent_before))
    draft = d.draft_tree(prompt, 5, cost=CostModel(lambda n: dict(NO_AMX), max_size=8))
    long_queue = queued > 3 + 1
    assert seen == ([(100.5, 1.25)] if long_queue else [(100.0, 0.0)])
    assert draft.auto is not None and d._drafted_ms == pytest.approx(1.25 if long_queue else 500.0)
