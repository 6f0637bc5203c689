"""Requests never leak into each other: the KV cache and every drafter's state (suffix automaton,
position index, EMA scores, EAGLE catch-up queue and head KV, auto-budget statistics) are reset per
request. Running A, then B, then A again must give A's trace twice, identical in every decision."""
import pytest

from respec.config import EngineConfig
from respec.drafters import make_drafter
from respec.engine import Engine
from respec.trace import result_to_dict
from tests.conftest import make_target

A = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6]
B = [40, 41, 42, 43, 44, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]


def _comparable(result):
    d = result_to_dict(result)
    for s in d["steps"]:
        s.pop("draft_ms"), s.pop("verify_ms"), s.pop("at_ms")
        for key in ("cost",):          # the cost model reads wall-clock times
            (s.get("decision") or {}).get("extra", {}).pop(key, None)
    for key in ("wall_time_s", "prefill_ms", "stats"):
        d.pop(key)
    return d


@pytest.mark.parametrize("method", ["vanilla", "eagle2", "sam", "respec", "respec-strict"])
def test_a_b_a_gives_identical_traces_with_one_engine(method):
    target = make_target("qwen2", seed=6)
    cfg = EngineConfig().with_overrides({"method": method, "max_new_tokens": 40, "trigger.theta_entropy": 20.0,
                                         "sam.len_threshold": 2, "candidates.min_match": 2,
                                         "tree.total_tokens": 10, "tree.depth": 3, "tree.top_k": 3})
    engine = Engine(target, make_drafter(method, target, cfg), cfg)   # one engine, one drafter, reused
    first = engine.generate(A)
    engine.generate(B)
    again = engine.generate(A)
    assert _comparable(first) == _comparable(again), \
        f"{method}: request B must leave no trace in the second run of A (tokens, trees, decisions, scores)."
    if method in ("sam", "respec"):
        assert any(s.source == "retrieval" for s in first.steps), "The test must exercise retrieval state."


def test_stopping_a_stream_midway_leaves_the_engine_reusable():
    target = make_target("llama", seed=2)
    cfg = EngineConfig().with_overrides({"method": "sam", "max_new_tokens": 40, "sam.len_threshold": 2})
    engine = Engine(target, make_drafter("sam", target, cfg), cfg)
    ref = engine.generate(A)
    stream = engine.stream(B)
    next(stream), next(stream)
    stream.close()                                   # a cancelled request (Stop / closed tab)
    assert _comparable(engine.generate(A)) == _comparable(ref)


def test_a_run_cancelled_mid_stream_in_the_app_frees_the_model_for_the_next():
    """Stop / a closed tab closes the page's generator mid-run: the tab may run again, the shared
    model's step lock is free, and the next run's trace equals an undisturbed run's."""
    from app.events import handlers
    from app.session.state import SessionState
    from tests.test_app_render import CAPS, REPEAT, tiny_hub
    hub = tiny_hub()
    values = {"max_new_tokens": 20, "theta_H": 20.0, "tree.auto": False}   # auto prunes by measured time
    ref = list(handlers.compare_stream(hub, CAPS, REPEAT, values, False, False, False, SessionState()))
    state = SessionState()
    state.running = True
    gen = handlers.compare_stream(hub, CAPS, REPEAT, values, False, False, False, state)
    for _ in range(4):
        next(gen)
    gen.close()                                       # what Gradio does on Stop / disconnect
    assert not state.running, "the tab can run again"
    assert hub._step_lock.acquire(timeout=1), "no lock is left held by the cancelled run"
    hub._step_lock.release()
    again = list(handlers.compare_stream(hub, CAPS, REPEAT, values, False, False, False, state))
    assert "done" in again[-1]["status"]
    for key in ("respec", "eagle"):
        assert _comparable(state.runs[key].result) == _comparable(_final_state_run(ref, key)), \
            f"{key}: the run after a cancelled one equals an undisturbed run"


def _final_state_run(updates, key):
    return updates[-1]["state"].runs[key].result
