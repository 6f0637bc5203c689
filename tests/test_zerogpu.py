"""ZeroGPU (issue 30 §3, §4): the page's `@gpu` functions run under a stand-in for `spaces`
(tests/zerogpu_standin.py) that runs each in a forked worker and pickles its arguments and every
yield, as `spaces` does. The Lab's yields cross that boundary (names, not components); a /compare
run made in the worker shows in /history; the page's run hands its history back through the state;
Stop pressed in the main process ends the run in the worker, the Compare run's and the Lab's."""
from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from app.page import ui  # noqa: E402
from app.session.settings import preset_values  # noqa: E402
from app.session.state import SessionState  # noqa: E402
from app.views.text import STOPPED  # noqa: E402
from tests import zerogpu_standin  # noqa: E402
from tests.test_app_render import CAPS, REPEAT, tiny_hub  # noqa: E402


@pytest.fixture
def demo(monkeypatch):
    import app.page.gpu
    monkeypatch.setattr(app.page.gpu, "_spaces", zerogpu_standin)
    monkeypatch.setenv("RESPEC_STREAM_INTERVAL", "0")       # an update per step: Stop lands mid-run
    blocks = ui.build_demo(hub=tiny_hub(), caps=CAPS)
    yield blocks
    blocks.close()


def _fn(demo, name: str):
    """The function of the demo's event or API endpoint whose (wrapped) name is `name`."""
    found = [bf.fn for bf in demo.fns.values() if getattr(bf.fn, "__name__", "") == name]
    assert len(found) == 1, f"{name}: {len(found)} functions"
    return found[0]


class Request:
    """What the endpoints read of a gr.Request (picklable, as the real one must be under spaces)."""

    def __init__(self, session_hash: str) -> None:
        self.session_hash = session_hash


def _settings() -> list:
    values = preset_values("device defaults", "cpu", CAPS)
    return [values[k] for k in ui.SPEC_KEYS]


def test_the_lab_streams_across_the_worker_boundary(demo, tmp_path):
    qfile = tmp_path / "q.jsonl"
    qfile.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["w5 w6 w7 w8 w5 w6 w7"]}) + "\n")
    run_lab = _fn(demo, "run_lab")
    updates = list(run_lab("methods", ["qa"], 1, 8, ["vanilla", "sam"], "respec", "", str(qfile), False,
                           *_settings(), SessionState()))
    values = {getattr(c, "elem_id", None): v for u in updates for c, v in u.items()}
    assert updates and "lab-status" in values, values.keys()
    assert not str(values["lab-status"]).startswith("⚠"), values["lab-status"]


def test_history_sees_the_compare_runs_made_in_the_worker(demo):
    compare, history = _fn(demo, "compare"), _fn(demo, "history")
    req = Request("client-1")
    out = compare(REPEAT, '{"max_new_tokens": 8, "theta_H": 20}', request=req)
    assert len(out) == 5 and out[0].strip()
    rows = json.loads(history(request=req))["rows"]
    assert len(rows) == 1 and rows[0]["prompt"] == REPEAT
    assert json.loads(history(request=Request("client-2")))["rows"] == []


def _page_run(demo, state: SessionState, stop_after: int | None = None) -> tuple[list, SessionState]:
    """The Run button as the page drives it: claim in the main process, the queued run (in the
    worker), Stop after `stop_after` updates. Returns the statuses and the state handed back."""
    ui._claim(state)
    run = _fn(demo, "run_compare")
    gen = run(REPEAT, False, False, False, "tiny", "respec", False, *_settings(), state, 1, "tokens/s")
    statuses, back = [], state
    for i, update in enumerate(gen):
        for comp, value in update.items():
            if isinstance(value, SessionState):
                back = value
            elif getattr(comp, "elem_id", None) == "status":
                statuses.append(value)
        if stop_after is not None and i + 1 == stop_after:
            ui._stop(state)                      # the main process's copy, as the Stop button does
    return statuses, back


def test_the_page_run_hands_its_history_back_and_stop_reaches_the_worker(demo):
    statuses, state = _page_run(demo, SessionState())
    assert state.history.rows and len(state.history.rows) == 1, statuses[-3:]
    assert statuses[-1].startswith("✔"), statuses[-1]
    statuses, after = _page_run(demo, state, stop_after=3)
    assert STOPPED in statuses, statuses
    assert not any(s.startswith("✔") for s in statuses), "the stopped run must not finish"
    assert len(after.history.rows) == 1, "a stopped run adds no row"


def test_the_labs_stop_reaches_the_worker_even_when_its_stream_is_not_closed(demo, tmp_path):
    """Stop in the main process raises the Lab's flag; the run in the worker polls it and ends with
    a stopped status after the record it is on, though the main side keeps reading (as a `spaces`
    that does not pass the cancel on would). The Compare run's Stop flag is untouched."""
    qfile = tmp_path / "q.jsonl"
    rows = [{"question_id": i, "category": "qa", "turns": [f"w{i} w5 w6 w7 w8 w5 w6 w7"]} for i in range(6)]
    qfile.write_text("".join(json.dumps(r) + "\n" for r in rows))
    state = SessionState()
    assert ui._claim_lab(state).startswith("▶")
    gen = _fn(demo, "run_lab")("methods", ["qa"], 6, 8, ["vanilla", "sam", "respec"], "respec", "", str(qfile),
                               False, *_settings(), state)
    statuses = []
    for update in gen:
        status = {getattr(c, "elem_id", None): v for c, v in update.items()}.get("lab-status")
        if status:
            statuses.append(status)
        if len(statuses) == 2:
            assert ui._stop_lab(state).startswith("■")         # the main process's copy, as the button does
    assert statuses[-1].startswith(ui.LAB_STOPPED), statuses[-3:]
    done, total = (int(x) for x in statuses[-1].split("(")[1].split(" ")[0].split("/"))
    assert total == 18 and done < total, statuses[-1]
    assert not any(s.startswith("✔") for s in statuses)
    assert not state.stop_requested
    ui._claim_lab(state)                                         # the next Lab run starts clear
    assert not state.lab_stop_requested
