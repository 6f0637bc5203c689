"""The run history of the Compare tab (app/session/history.py, app/events/tuning.py): rows from metrics, settings
that differ from the device defaults, a pinned baseline and deltas against it, the median and
spread of repeats and the noise verdict, the size bound, CSV / JSON / plot views, and (tiny model,
no server) repeats and failed runs through the page's run handler."""
import copy
import json

import pandas as pd
import pytest

from app.session import history

from app.views import history_view as history_display

from app.events import tuning
from app.session.history import History, HistoryStore, build_row, compare_rows, entry_from_metrics, noise_verdict
from app.session.settings import preset_values
from app.session.state import SessionState
from tests.test_app_render import CAPS, REPEAT, tiny_hub


def metrics(tps, mat=2.0, method="respec", speedup=1.5, kind="estimated", steps=10, retrieval=4, trigger=0.5,
            relaxed=0, new_tokens=20):
    return {"method": method, "tokens_per_s": tps, "mean_accepted_length": mat, "speedup": speedup,
            "speedup_kind": kind, "steps": steps, "steps_by_source": {"retrieval": retrieval, "eagle": steps - retrieval},
            "trigger_rate": trigger, "relaxed_tokens": relaxed, "new_tokens": new_tokens}


def row(tps=(10.0,), mat=2.0, tokens=(1, 2, 3), theta=3.0, vanilla_tps=None, vanilla_tokens=(1, 2, 3)):
    settings = dict(preset_values("device defaults", "cpu", CAPS))
    settings["trigger.theta_entropy"] = theta
    ms = {"respec": [metrics(t, mat) for t in tps], "eagle": [metrics(t / 2, 1.5, "eagle2", trigger=None) for t in tps]}
    toks = {"respec": tokens, "eagle": tokens}
    if vanilla_tps is not None:
        ms["vanilla"] = [metrics(vanilla_tps, 1.0, "vanilla", trigger=None, retrieval=0)]
        toks["vanilla"] = vanilla_tokens
    return build_row("a prompt", "default", settings, history.changed_settings(settings, "cpu", CAPS), ms, toks,
                     "12:00:00")


# ------------------------------------------------------------------------------- rows
def test_an_entry_keeps_every_repeat_and_reports_median_and_spread():
    e = entry_from_metrics("respec", [metrics(10.0), metrics(14.0), metrics(11.0)], [5, 6])
    assert e.tokens_per_s == (10.0, 14.0, 11.0) and e.repeats == 3
    assert (e.median, e.low, e.high, e.spread) == (11.0, 10.0, 14.0, 4.0)
    assert e.spread_pct == pytest.approx(100 * 2 / 11)
    assert e.retrieval_share == pytest.approx(0.4), "retrieval share = retrieval steps / steps"
    assert list(e.tokens) == [5, 6]
    assert "median 11.0 tok/s" in history_display.timing_text(e) and "spread 10.0–14.0" in history_display.timing_text(e)
    single = entry_from_metrics("respec", [metrics(10.0)])
    assert single.spread is None and history_display.timing_text(single) == "10.0 tok/s"
    with pytest.raises(ValueError):
        entry_from_metrics("respec", [])


def test_speedup_is_measured_only_when_every_repeat_measured_it():
    both = entry_from_metrics("respec", [metrics(10, speedup=2.0, kind="measured"),
                                         metrics(10, speedup=3.0, kind="measured")])
    assert both.speedup_kind == "measured" and both.speedup == 2.5
    mixed = entry_from_metrics("respec", [metrics(10, kind="measured"), metrics(10, kind="estimated")])
    assert mixed.speedup_kind == "estimated"


def test_settings_that_differ_from_the_device_defaults():
    base = preset_values("device defaults", "cpu", CAPS)
    assert history.changed_settings(base, "cpu", CAPS) == {}
    changed = history.changed_settings({**base, "trigger.theta_entropy": 1.5, "candidates.min_match": 3}, "cpu", CAPS)
    assert changed == {"trigger.theta_entropy": 1.5, "candidates.min_match": 3}
    assert history.settings_label(changed) == "θ_H=1.5, L_min=3"
    assert history.settings_label({}) == "defaults"


def test_equal_to_vanilla_from_tokens_or_given():
    r = row(vanilla_tps=5.0, tokens=(1, 2, 3), vanilla_tokens=(1, 2, 4))
    assert r.entries["respec"].equal_to_vanilla is False and r.entries["vanilla"].equal_to_vanilla is True
    assert row().entries["respec"].equal_to_vanilla is None, "without vanilla it is unknown"
    given = build_row("p", "m", {}, {}, {"respec": [metrics(1.0)]}, {"respec": (1,)}, "t",
                      equal_to_vanilla={"respec": True})
    assert given.entries["respec"].equal_to_vanilla is True


# ------------------------------------------------------------------------------- history, pin, deltas
def test_rows_are_numbered_and_the_history_is_bounded():
    h = History(max_rows=3)
    for theta in (1.0, 2.0, 3.0, 4.0, 5.0):
        h.add(row(theta=theta))
    assert [r.number for r in h.rows] == [3, 4, 5], "The oldest rows go first; numbers keep counting."
    h.clear()
    assert h.rows == [] and h.pinned is None and h.add(row()).number == 1


def test_the_pinned_row_outlives_the_table_and_later_runs_get_deltas():
    h = History(max_rows=2)
    h.add(row(theta=1.5, tps=(10.0,), mat=2.0))
    a = h.pin(1)
    assert h.delta() is None, "A has no delta against itself."
    h.add(row(theta=2.5, tps=(12.0,), mat=2.5, tokens=(1, 2, 9, 9)))
    h.add(row(theta=2.5, tps=(11.0,)))
    assert [r.number for r in h.rows] == [2, 3] and h.pinned is a and h.get(1) is a
    d = h.delta(h.get(2))
    m = d.methods["respec"]
    assert m.change_pct == pytest.approx(20.0) and (m.mat_a, m.mat_b) == (2.0, 2.5)
    assert not m.identical and m.first_difference == 2
    assert d.settings == [("trigger.theta_entropy", 1.5, 2.5)]
    assert m.noise is None, "Two single timings cannot tell noise from a change."
    with pytest.raises(KeyError):
        h.pin(99)


def test_the_noise_verdict_compares_the_spreads():
    e = lambda *tps: entry_from_metrics("respec", [metrics(t) for t in tps])  # noqa: E731
    assert noise_verdict(e(10.0), e(11.0)) is None
    assert noise_verdict(e(10.0, 12.0, 11.0), e(11.5, 13.0, 12.5)) == "within"
    assert noise_verdict(e(10.0, 12.0, 11.0), e(13.0, 14.0, 13.5)) == "outside"
    assert noise_verdict(e(10.0), e(9.0, 11.0)) == "within", "A single run inside the other's range is noise."
    assert noise_verdict(e(15.0), e(9.0, 11.0)) == "outside"


def test_compare_rows_reports_identical_outputs():
    d = compare_rows(row(tps=(10.0, 11.0, 12.0)), row(tps=(20.0, 21.0, 22.0)))
    assert d.methods["respec"].identical and d.methods["respec"].first_difference is None
    assert d.methods["respec"].noise == "outside" and d.settings == []
    assert "vanilla" not in d.methods, "Only columns both runs have are compared."


# ------------------------------------------------------------------------------- views
def test_csv_and_table_hold_every_row(tmp_path):
    h = History(max_rows=10)
    h.add(row(theta=1.5))
    h.add(row(theta=2.5, tps=(10.0, 12.0, 14.0), vanilla_tps=5.0))
    h.pin(1)
    df = pd.read_csv(history_display.write_csv(h, str(tmp_path / "sub" / "h.csv")))
    assert list(df["run"]) == [1, 2] and list(df["A"].fillna("")) == ["A", ""]
    assert list(df["settings ≠ defaults"]) == ["θ_H=1.5", "θ_H=2.5"]
    assert df["ReSpec tok/s"].iloc[1] == 12.0 and df["ReSpec tok/s spread"].iloc[1] == 4.0
    for col in ("ReSpec MAT", "ReSpec trigger rate", "ReSpec retrieval share", "ReSpec relaxed tokens",
                "ReSpec speedup", "ReSpec = vanilla", "EAGLE-2 tok/s", "vanilla tok/s"):
        assert col in df.columns, col
    shown = history_display.table(h)
    assert list(shown["run"]) == [2, 1], "The page shows the newest run first."
    assert history_display.table(History()).empty


def test_json_has_settings_metrics_and_deltas_after_a():
    h = History()
    h.add(row(theta=1.5))
    h.add(row(theta=2.5))
    h.pin(2)
    h.add(row(theta=3.5, tokens=(1, 7)))
    data = json.loads(json.dumps(history_display.history_json(h), allow_nan=False))
    assert data["pinned"] == 2 and [r["run"] for r in data["rows"]] == [1, 2, 3]
    assert "delta_vs_A" not in data["rows"][0] and "delta_vs_A" not in data["rows"][1]
    delta = data["rows"][2]["delta_vs_A"]
    assert delta["against"] == 2 and delta["methods"]["respec"]["first_difference"] == 1
    assert data["rows"][0]["changed"] == {"trigger.theta_entropy": 1.5}
    assert data["rows"][0]["methods"]["respec"]["retrieval_share"] == pytest.approx(0.4)


def test_the_plot_colours_runs_by_their_changed_settings():
    h = History()
    for theta in (1.5, 2.5, 1.5):
        h.add(row(theta=theta, tps=(10.0, 12.0)))
    fig = history_display.history_figure(h, "tokens/s")
    names = [t.name for t in fig.data if t.mode == "markers"]
    assert names == ["θ_H=1.5 · ReSpec", "θ_H=1.5 · EAGLE-2", "θ_H=2.5 · ReSpec", "θ_H=2.5 · EAGLE-2"]
    first = next(t for t in fig.data if t.name == "θ_H=1.5 · ReSpec")
    assert list(first.x) == [1, 3] and list(first.error_y.array) == [1.0, 1.0]
    mat = history_display.history_figure(h, "MAT")
    assert {tuple(t.y) for t in mat.data if t.mode == "markers"} == {(2.0, 2.0), (2.0,), (1.5, 1.5), (1.5,)}


def test_the_summary_names_median_spread_and_deltas():
    h = History()
    assert "No runs yet" in history_display.summary_html(h)
    h.add(row(theta=1.5, tps=(10.0,)))
    assert "Pin a run" in history_display.summary_html(h)
    h.pin(1)
    h.add(row(theta=2.5, tps=(10.5, 9.5, 11.0)))
    text = history_display.summary_html(h)
    assert "median 10.5 tok/s, spread 9.5–11.0" in text
    assert "vs A = run #1" in text and "θ_H 1.5 → 2.5" in text and "within the spread" in text


def test_api_histories_are_per_client_and_bounded():
    store = HistoryStore(capacity=2, max_rows=5)
    store.get("a").add(row())
    assert len(store.get("a").rows) == 1 and store.get("b").rows == [], "Clients do not share rows."
    store.get("c")
    assert len(store) == 2 and store.get("a").rows == [], "The least recently used client's history went first."


# ------------------------------------------------------------------------------- sessions and the run handler
def test_each_session_has_its_own_history_and_replays_keep_it():
    s1 = SessionState()
    s1.history.add(row())
    assert SessionState().history.rows == [], "A new session starts empty (no shared default)."
    assert copy.deepcopy(SessionState()).history is not s1.history
    s1.clear()                                         # what opening or uploading a trace does
    assert len(s1.history.rows) == 1


@pytest.fixture(scope="module")
def hub():
    return tiny_hub()


def test_repeats_make_one_row_with_the_median_and_spread(hub):
    st = SessionState()
    ups = list(tuning.compare_with_history(hub, CAPS, REPEAT, {"theta_H": 20.0, "max_new_tokens": 8}, True,
                                           False, False, st, None, repeats=3))
    assert len(st.history.rows) == 1, "N repeats are one row."
    r = st.history.rows[0]
    assert all(e.repeats == 3 for e in r.entries.values()) and r.entries["respec"].speedup_kind == "measured"
    assert r.entries["respec"].equal_to_vanilla is True, "Greedy and lossless: the same tokens as vanilla."
    assert r.changed["trigger.theta_entropy"] == 20.0 and r.settings["max_new_tokens"] == 8
    assert any(str(u.get("status", "")).startswith("repeat 3/3") for u in ups)
    assert "median" in ups[-1]["status"] and "spread" in ups[-1]["history_summary"]
    # The history goes out with the run's last update, not after it: a later update without the
    # explorer's plots would be streamed as a diff that empties them in the browser.
    assert {"tree_plot", "entropy_plot", "history_plot", "history_table"} <= set(ups[-1])
    assert not st.running, "The tab may run again."


def test_every_repeat_runs_even_when_a_new_run_reuses_a_freed_runs_address(hub, monkeypatch):
    """Regression (flaky browser test: "repeat 2/3 · ✔ done", then nothing): a repeat was judged
    fresh by the id()s of the runs on screen before it, but compare_stream drops those runs and a
    new Run may be allocated at a freed one's address. Here each repeat rebuilds its Runs right
    after clearing the state, so CPython hands out the freed addresses again: every repeat must
    still run, the row must be added, and the run hub and the tab must be free afterwards."""
    from app.events import handlers
    from app.events.runs import plan_methods
    from app.session.state import Run

    real = SessionState()
    list(handlers.compare_stream(hub, CAPS, REPEAT, {"max_new_tokens": 6}, True, False, False, real, None))
    finished = {k: (r.result, r.decoder) for k, r in real.runs.items()}
    calls, reused = [], []

    def compare_stream(hub_, caps, prompt, values, include_vanilla, show_rejected, teaching, state, model=None):
        try:
            old = {id(r) for r in state.runs.values()}
            state.clear()                               # frees the last repeat's Run objects
            for key, _ in plan_methods(include_vanilla):
                state.put(key, Run(*finished[key]))     # a fresh live run, likely at a freed address
            reused.append(bool(old & {id(r) for r in state.runs.values()}))
            calls.append(len(calls) + 1)
            yield {"status": "✔ done"}
        finally:
            state.running = False

    monkeypatch.setattr(handlers, "compare_stream", compare_stream)
    probe = SessionState()
    for _ in range(3):
        list(compare_stream(hub, CAPS, REPEAT, {}, True, False, False, probe))
    assert reused[1:] == [True, True], "the pattern under test: with nothing else holding the old Runs, " \
                                       "the new ones take their addresses (CPython reuses freed memory)"
    calls.clear()
    st = SessionState()
    for key, (result, decoder) in finished.items():     # a finished run already on screen, as in the page
        st.put(key, Run(result, decoder))
    st.running = True                                   # what the Run button's claim does
    ups = list(tuning.compare_with_history(hub, CAPS, REPEAT, {"max_new_tokens": 6}, True, False, False, st,
                                           None, repeats=3))
    assert calls == [1, 2, 3], "All three repeats ran."
    assert [u["status"] for u in ups[:2]] == ["repeat 1/3 · ✔ done", "repeat 2/3 · ✔ done"]
    assert "run #1 added to the history" in ups[-1]["status"] and "repeat ×3" in ups[-1]["status"]
    assert len(st.history.rows) == 1 and all(e.repeats == 3 for e in st.history.rows[0].entries.values())
    assert not st.running and not st.stop_requested, "The tab may run again."
    assert hub._step_lock.acquire(blocking=False), "No run holds the model's step lock."
    hub._step_lock.release()


def test_a_failed_run_adds_no_row_and_restore_gives_back_a(hub):
    st = SessionState()
    list(tuning.compare_with_history(hub, CAPS, "   ", {}, False, False, False, st, None, 2))
    list(tuning.compare_with_history(hub, CAPS, REPEAT, {"theta_H": 99}, False, False, False, st, None, 1))
    assert st.history.rows == [], "An empty prompt or bad settings add nothing."
    list(tuning.compare_with_history(hub, CAPS, REPEAT, {"theta_H": 2.0, "max_new_tokens": 6}, False, False,
                                     False, st, None, 1))
    st.history.pin(1)
    restored = tuning.restore_settings(st)
    assert restored["trigger.theta_entropy"] == 2.0 and restored["max_new_tokens"] == 6
    assert set(restored) == {s.key for s in history.SPECS} | {"tree.auto"}
    views = tuning.history_views(st, hub)
    assert views["history_csv"]["visible"] and views["history_csv"]["value"].endswith(".csv")


def test_an_update_held_back_when_stop_is_pressed_goes_out_as_stopped(hub, monkeypatch):
    """Regression (flaky browser test: after Stop the status stayed "▶ ReSpec: step 1, 2 tokens"):
    compare_with_history holds each update back one step, so the stream's update from before Stop
    went out after it, and Stop's cancellation could end the stream right there. Every update sent
    once Stop was pressed must say stopped."""
    from app.events import handlers
    from app.views.text import STOPPED
    st = SessionState()

    def compare_stream(hub_, caps, prompt, values, include_vanilla, show_rejected, teaching, state, model=None):
        yield {"status": "▶ ReSpec: step 1, 2 tokens", "respec_out": "partial"}
        state.stop_requested = True                      # Stop pressed between two updates
        yield {"status": STOPPED}

    monkeypatch.setattr(handlers, "compare_stream", compare_stream)
    ups = list(tuning.compare_with_history(hub, CAPS, REPEAT, {}, True, False, False, st, None))
    assert [u["status"] for u in ups] == [STOPPED, STOPPED]
    assert ups[0]["respec_out"] == "partial", "only the status of the held update changes"
    assert not st.history.rows, "a stopped run adds no row"
