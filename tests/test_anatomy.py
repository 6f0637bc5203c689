"""Why a draft pays or not (respec/anatomy.py): acceptance by draft position counted on hand-built
steps and on real runs, and the speedup's factors multiplying back to the measured speedup."""
import pytest

from respec.anatomy import DepthAcceptance, Totals, acceptance_by_depth, anatomy, totals_of
from respec.trace import StepTrace
from respec.tree import DraftTree
from respec.verify import Verdict
from tests.conftest import OracleDrafter, make_target, run


def _step(tree: DraftTree, status: tuple[str, ...], source: str) -> StepTrace:
    path = tuple(i for i, s in enumerate(status) if s in ("accepted", "relaxed"))
    verdict = Verdict(path=path, next_token=9, next_kind="bonus", node_status=status,
                      num_relaxed=sum(s == "relaxed" for s in status))
    n = len(path)
    return StepTrace(step=0, source=source, tree=tree, verdict=verdict, new_tokens=tuple(range(n)),
                     entropies=(0.0,) * n, margins=(1.0,) * n, draft_ms=1.0, verify_ms=10.0)


def test_depth_counts_on_hand_built_steps():
    chain = DraftTree(tokens=(1, 2, 3, 4), parents=(-1, 0, 1, 2), sources=("root", "eagle", "eagle", "eagle"))
    # EAGLE chain: depth 1 and 2 accepted, depth 3 rejected
    a = _step(chain, ("accepted", "accepted", "accepted", "rejected"), "eagle")
    # a retrieval tree: two siblings at depth 1 (one rejected), the other's child relaxed, its child unvisited
    tree = DraftTree(tokens=(1, 5, 6, 7, 8), parents=(-1, 0, 0, 2, 3),
                     sources=("root", "retrieval", "retrieval", "retrieval", "retrieval"))
    b = _step(tree, ("accepted", "rejected", "accepted", "relaxed", "rejected"), "retrieval")
    plain = _step(DraftTree.root_only(1), ("accepted",), "none")
    t = acceptance_by_depth([a, b, plain])
    assert t.reached == {"eagle": [1, 1, 1], "retrieval": [2, 1, 1]}
    assert t.accepted == {"eagle": [1, 1], "retrieval": [1, 1]}
    assert t.rate(1) == pytest.approx(2 / 3) and t.rate(1, "eagle") == 1.0 and t.rate(1, "retrieval") == 0.5
    assert t.rate(3) == 0.0 and t.rate(5) is None
    assert t.relaxed_share(2, "retrieval") == 1.0 and t.relaxed_share(2, "eagle") == 0.0
    assert t.drafting_steps == {"eagle": 1, "retrieval": 1}, "a plain step drafts nothing"
    assert t.reach(1) == 1.0 and t.reach(2) == 1.0 and t.reach(3) == 0.0
    assert t.hold("eagle") == 2.0 and t.hold("retrieval") == 2.0 and t.hold("none") is None
    both = t.merge(acceptance_by_depth([a]))
    assert both.reached["eagle"] == [2, 2, 2] and both.drafting_steps["eagle"] == 2
    assert DepthAcceptance.from_dict(both.to_dict()) == both
    assert [r["depth"] for r in both.rows()] == [1, 2, 3]


@pytest.mark.parametrize("method", ["sam", "eagle2", "respec-strict"])
def test_real_runs_count_every_accepted_token_and_the_factors_multiply_back(method):
    target = make_target("llama", seed=0)
    prompt = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 4
    ref = run(target, "vanilla", prompt, max_new_tokens=40)
    overrides = {"tree.auto": False, "tree.total_tokens": 8, "sam.len_threshold": 2,
                 "candidates.min_match": 2, "trigger.theta_entropy": 20.0}
    drafter = OracleDrafter(ref.tokens, len(prompt), "partial", 128) if method == "eagle2" else None
    out = run(target, method, prompt, drafter=drafter, max_new_tokens=40, **overrides)
    t = acceptance_by_depth(out.steps)
    assert sum(sum(v) for v in t.accepted.values()) == out.stats.accepted_tokens
    assert sum(sum(v) for v in t.reached.values()) <= out.stats.draft_tokens
    assert sum(t.held.values()) == out.stats.accepted_tokens
    run_t, van_t = totals_of(out), totals_of(ref)
    assert van_t.forwards == len(ref.tokens) and van_t.tokens == len(ref.tokens), "vanilla: one token per forward"
    a = anatomy(run_t, van_t)
    measured = out.stats.tokens_per_s / ref.stats.tokens_per_s
    assert a.speedup == pytest.approx(measured, rel=0.01), "the factors multiply back to the measured speedup"
    assert a.token_factor * a.cost_factor == pytest.approx(measured, rel=1e-9)
    assert a.vanilla_tokens_per_forward == 1.0
    parts = a.verify_ms + a.draft_ms + a.prefill_ms + a.other_ms
    assert parts == pytest.approx(a.ms_per_forward)
    steps = out.steps          # the loop's own work: the wall less prefill, drafting and forwards, per step
    loop = (out.wall_time_s * 1000 - out.prefill_ms - sum(s.verify_ms + s.draft_ms for s in steps)) / len(steps)
    assert a.loop_ms_per_step == pytest.approx(loop) and a.loop_ms_per_step > 0
    assert a.sentence(method).endswith(f"so {a.speedup:.2f}x")


def test_totals_add_and_prediction_is_read_from_planned_steps():
    target = make_target("qwen2", seed=1)
    prompt = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 4
    out = run(target, "sam", prompt, max_new_tokens=40, **{"tree.auto": True, "tree.total_tokens": 8,
                                                           "sam.n_predicts": 15, "sam.len_threshold": 2})
    t = totals_of(out)
    planned = [s for s in out.steps if s.decision and "expected_tokens" in s.decision.extra.get("cost", {})]
    assert t.planned_steps == len(planned) > 0
    assert t.predicted_tokens == pytest.approx(sum(s.decision.extra["cost"]["expected_tokens"] for s in planned))
    assert t.realised_tokens == sum(len(s.new_tokens) for s in planned)
    assert (t + t).tokens == 2 * t.tokens and (t + Totals()).wall_ms == t.wall_ms
    a = anatomy(t, totals_of(run(target, "vanilla", prompt, max_new_tokens=40)))
    assert a.predicted_tokens == pytest.approx(t.predicted_tokens / t.planned_steps)
