"""Tuning by hand on the Compare tab (issue 20): the run history, a pinned baseline "A", and
repeats. The Gradio-facing glue; the logic lives in `app.session.history` and its views in
`app.views.history_view`.

Contract:
* `compare_with_history(...)` wraps `handlers.compare_stream`: it runs the same settings `repeats`
  times (1..MAX_REPEATS; each repeat streams like a plain run, its status prefixed "repeat i/N"),
  then adds one row to the tab's `SessionState.history` and yields the history views. A run that
  fails or is stopped adds no row.
* `build_history_panel()` lays out the panel (element ids: run-history, history-plot,
  history-metric, history-csv, pin-run, pin-a, restore-a, clear-history, baseline-delta,
  baseline-diff); `wire_history_events(...)` connects pin / restore / clear / plot metric.
  Every handler returns a dict keyed by `HISTORY_OUTPUTS` names (or control values for restore).
* `record_api_run` adds a `/compare` call to its API client's history (keyed by the client's
  session, `HistoryStore`); `api_history` answers `/history` with that client's rows as JSON.
* The CSV export is written into the session's own folder (`SessionState.trace_dir`, removed
  with the session).
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable, Iterator, Mapping, Sequence

from app.events import handlers
from app.events.runs import plan_methods
from app.session import history
from app.session.history import History, HistoryRow, HistoryStore
from app.session.settings import SPECS, Caps
from app.session.state import SessionState
from app.session.traces import session_dir
from app.views import history_view as history_display
from app.views import render
from app.views.decoders import TableDecoder, TokenizerDecoder
from app.views.text import DIFF_COLORS, STOPPED
from respec.config import flatten_settings
from respec.trace import result_from_json

MAX_REPEATS = 10
#: Output names of the history panel (handlers return dicts keyed by these).
HISTORY_OUTPUTS = ("history_summary", "history_diff", "history_table", "history_plot", "history_csv", "pin_choice")


# ------------------------------------------------------------------------------- rows from runs
def settings_of(config) -> dict[str, Any]:
    """Every control's value (SPECS keys + tree.auto) as a run's EngineConfig had it."""
    flat = flatten_settings(config.to_dict())
    return {k: flat[k] for k in [s.key for s in SPECS] + ["tree.auto"] if k in flat}


def page_row(repeats: Sequence[Mapping[str, Any]], prompt: str, model: str, device: str, caps: Caps) -> HistoryRow:
    """A history row from the finished results of each repeat ({column: GenerationResult})."""
    metrics: dict[str, list[dict]] = {}
    for results in repeats:
        vanilla = results.get("vanilla")
        for col, res in results.items():
            metrics.setdefault(col, []).append(render.run_metrics(res, vanilla))
    last = repeats[-1]
    settings = settings_of(next(iter(last.values())).config)
    return history.build_row(prompt, model, settings, history.changed_settings(settings, device, caps), metrics,
                             {col: res.tokens for col, res in last.items()}, time.strftime("%H:%M:%S"))


def _repeats(value: Any) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return 1
    return max(1, min(MAX_REPEATS, n))


def _after_stop(update: dict[str, Any], state: SessionState) -> dict[str, Any]:
    """An update held back one step, as it may go out once Stop was pressed: its status says
    stopped. (Stop cancels the stream at its next yield, which may be the one that sends this
    held update; a stale "▶ step 1" there would stay on screen instead of the stop.)"""
    if state.stop_requested and "status" in update:
        return {**update, "status": STOPPED}
    return update


def compare_with_history(hub, caps: Caps, prompt: str, values: Mapping[str, Any], include_vanilla: bool,
                         show_rejected: bool, teaching: bool, state: SessionState, model: str | None,
                         repeats: Any = 1, metric: str = "tokens/s") -> Iterator[dict[str, Any]]:
    """The Run button with history: `repeats` compare runs of the same settings, then one row."""
    state = state if isinstance(state, SessionState) else SessionState()
    n = _repeats(repeats)
    plan = [key for key, _ in plan_methods(bool(include_vanilla))]
    done: list[dict[str, Any]] = []
    for i in range(n):
        if i:
            if state.stop_requested:
                return
            state.running = True              # compare_stream cleared it at the end of the last repeat
        # The runs on screen before this repeat, held (not their id()s): compare_stream drops them
        # from the state, and a freed object's id can be reused by the next Run allocated, which
        # made a fresh run look stale now and then (no row, and the remaining repeats skipped).
        before = list(state.runs.values())
        last: dict[str, Any] | None = None    # held back one update: the run's last one may get the history
        for update in handlers.compare_stream(hub, caps, prompt, values, include_vanilla, show_rejected, teaching,
                                              state, model):
            status = update.get("status")
            if n > 1 and isinstance(status, str) and not status.startswith("⚠"):
                update = {**update, "status": f"repeat {i + 1}/{n} · {status}"}
            if last is not None:
                yield _after_stop(last, state)
            last = update
        fresh = all(k in state.runs and state.runs[k].origin == "live"
                    and not any(state.runs[k] is old for old in before) for k in plan)
        if state.stop_requested or not fresh or i + 1 < n:
            if last is not None:
                yield _after_stop(last, state)
            if state.stop_requested or not fresh:
                return                        # failed or stopped: no row
        done.append({k: state.runs[k].result for k in plan})
    state.running = False
    row = state.history.add(page_row(done, prompt, model or hub.spec, hub.device(), caps))
    # The history views go out in the same update as the run's last one (the explorer's plots and
    # tables), never in an update of their own: Gradio streams each update as a diff against the
    # one before, and an output missing from an update after a dict value (a plot, a table) is
    # sent as edits that the browser applies in place to the value on screen, emptying it.
    out = (last or {}) | history_views(state, hub, metric)
    first = row.entries.get("respec") or next(iter(row.entries.values()))
    out["status"] = (f"✔ done — run #{row.number} added to the history"
                     + (f"; repeat ×{n}: {history.COLUMN_NAMES[first.column]} {history_display.timing_text(first)}"
                        if n > 1 else ""))
    yield out


# ------------------------------------------------------------------------------- views
def _csv_path(state: SessionState) -> str | None:
    hist = state.history
    if not hist.rows:
        return None
    # A new name for every content, so no cached copy of an older export is ever served.
    name = f"run-history-{hist.rows[0].number}-to-{hist.rows[-1].number}" \
           f"{'-A' + str(hist.pinned.number) if hist.pinned else ''}.csv"
    return history_display.write_csv(hist, os.path.join(session_dir(state), name))


def _decoder(hub):
    tok = getattr(hub, "tokenizer", None)
    return TokenizerDecoder(tok) if tok is not None else TableDecoder()


def diff_update(hist: History, hub) -> Any:
    """The token diff of the latest run against A (the first column whose output differs)."""
    import gradio as gr
    d = hist.delta()
    col = None if d is None else next((c for c, m in d.methods.items() if not m.identical), None)
    if d is None or col is None or d.a.model != d.b.model:
        return gr.update(value=[], visible=False)
    dec = _decoder(hub)
    _, first, spans = render.aligned_diff(d.a.entries[col].tokens, d.b.entries[col].tokens, dec, dec)
    return gr.update(value=spans, visible=True,
                     label=f"{history.COLUMN_NAMES[col]} token diff: A = run #{d.a.number}, B = run #{d.b.number} "
                           f"(first difference at token {first})")


def history_views(state: SessionState, hub, metric: str = "tokens/s") -> dict[str, Any]:
    """Every view of the history panel from the tab's history."""
    import gradio as gr
    hist = state.history
    csv = _csv_path(state)
    latest = hist.latest
    return {"history_summary": history_display.summary_html(hist),
            "history_diff": diff_update(hist, hub),
            "history_table": history_display.table(hist),
            "history_plot": history_display.history_figure(hist, metric if metric in history_display.METRIC_CHOICES else "tokens/s"),
            "history_csv": gr.update(value=csv, visible=csv is not None),
            "pin_choice": gr.update(choices=[(r.choice(), r.number) for r in reversed(hist.rows)],
                                    value=latest.number if latest else None)}


def pin(hub, number: Any, metric: str, state: SessionState) -> dict[str, Any]:
    import gradio as gr
    state = state if isinstance(state, SessionState) else SessionState()
    try:
        row = state.history.pin(number)
    except KeyError:
        gr.Warning("Pick a run of the history to pin first.")
        return {}
    gr.Info(f"Run #{row.number} ({row.label}) is now A: later runs show their deltas against it.")
    out = history_views(state, hub, metric)
    out["pin_choice"] = gr.update(value=row.number)
    return out


def clear(hub, metric: str, state: SessionState) -> dict[str, Any]:
    state = state if isinstance(state, SessionState) else SessionState()
    state.history.clear()
    return history_views(state, hub, metric)


def replot(metric: str, state: SessionState) -> dict[str, Any]:
    hist = state.history if isinstance(state, SessionState) else History()
    return {"history_plot": history_display.history_figure(hist, metric if metric in history_display.METRIC_CHOICES else "tokens/s")}


def restore_settings(state: SessionState) -> dict[str, Any] | None:
    """A's settings (every control and tree.auto), or None (with a warning) when nothing is pinned."""
    import gradio as gr
    pinned = state.history.pinned if isinstance(state, SessionState) else None
    if pinned is None:
        gr.Warning("Pin a run as A first: its settings are what “restore” puts back.")
        return None
    return dict(pinned.settings)


# ------------------------------------------------------------------------------- the page
def build_history_panel() -> dict[str, Any]:
    """The history panel's components (inside the Compare tab)."""
    import gradio as gr
    c: dict[str, Any] = {}
    with gr.Accordion("Run history — tune by hand: compare runs, pin a baseline A, repeat to beat the noise",
                      open=True, elem_id="history-panel"):
        gr.Markdown(history_display.NOISE_NOTE)
        c["history_summary"] = gr.HTML(history_display.summary_html(History(max_rows=1)), elem_id="baseline-delta")
        c["history_diff"] = gr.HighlightedText([], label="token diff against A", color_map=DIFF_COLORS,
                                               show_legend=True, visible=False, elem_id="baseline-diff")
        with gr.Row(equal_height=False):
            c["pin_choice"] = gr.Dropdown([], value=None, label="run", elem_id="pin-run", scale=3,
                                          allow_custom_value=False)
            with gr.Column(scale=2, min_width=200):
                c["pin_btn"] = gr.Button("pin this run as A", size="sm", elem_id="pin-a")
                c["restore_btn"] = gr.Button("↺ restore A's settings", size="sm", elem_id="restore-a")
            with gr.Column(scale=2, min_width=200):
                c["history_csv"] = gr.DownloadButton("⬇ history as CSV", visible=False, size="sm",
                                                     elem_id="history-csv")
                c["clear_btn"] = gr.Button("clear history", size="sm", elem_id="clear-history")
        c["history_table"] = gr.Dataframe(history_display.table(History(max_rows=1)), label="runs (newest first; click a "
                                          "header to sort)", interactive=False, wrap=False, max_height=340,
                                          elem_id="run-history")
        c["metric"] = gr.Radio(list(history_display.METRIC_CHOICES), value="tokens/s", label="plot",
                               elem_id="history-metric")
        c["history_plot"] = gr.Plot(history_display.history_figure(History(max_rows=1)), show_label=False,
                                    elem_id="history-plot")
    return c


def wire_history_events(hub, c: Mapping[str, Any], state, controls: Sequence[Any], keys: Sequence[str],
                        to_json: Callable[[dict], str], status) -> None:
    """Pin, restore, clear and the plot's metric. `controls` are the settings controls for `keys`
    (SPECS keys, then "tree.auto", then the settings JSON box); `to_json(settings)` renders that box."""
    import functools

    import gradio as gr
    outs = [c[k] for k in HISTORY_OUTPUTS]

    def bind(fn):
        @functools.wraps(fn)
        def call(*args):
            d = fn(*args)
            return {c[k]: v for k, v in d.items() if k in c}
        return call

    c["pin_btn"].click(bind(functools.partial(pin, hub)), [c["pin_choice"], c["metric"], state], outs,
                       api_visibility="private", queue=False)
    c["clear_btn"].click(bind(functools.partial(clear, hub)), [c["metric"], state], outs,
                         api_visibility="private", queue=False)
    c["metric"].change(bind(replot), [c["metric"], state], [c["history_plot"]], api_visibility="private",
                       queue=False)

    def restore(st):
        settings = restore_settings(st)
        if settings is None:
            return [gr.update() for _ in controls] + [gr.update()]
        return ([settings.get(k, gr.update()) for k in keys] + [to_json(settings)]
                + [f"↺ restored the settings of run #{st.history.pinned.number} (A)"])
    c["restore_btn"].click(restore, [state], [*controls, status], api_visibility="private", queue=False)


# ------------------------------------------------------------------------------- the API
def record_api_run(store: HistoryStore, session: str | None, hub, caps: Caps, prompt: str,
                   outputs: Sequence[str]) -> HistoryRow | None:
    """Add one `/compare` call (its five outputs) to the history of the client's session."""
    if not session:
        return None
    _, _, trace_a, trace_b, metrics_json = outputs
    metrics = json.loads(metrics_json)
    ra, rb = result_from_json(trace_a), result_from_json(trace_b)
    cols = {k: [metrics[k]] for k in history.COLUMNS if isinstance(metrics.get(k), dict)}
    settings = settings_of(ra.config)
    eq = (metrics.get("comparison") or {}).get("equal_to_vanilla")
    row = history.build_row(prompt, hub.spec, settings, history.changed_settings(settings, hub.device(), caps), cols,
                            {"respec": ra.tokens, "eagle": rb.tokens}, time.strftime("%H:%M:%S"), source="api",
                            equal_to_vanilla=eq if isinstance(eq, dict) else None)
    return store.get(session).add(row)


def api_history(store: HistoryStore, session: str | None) -> str:
    """`/history`: this client's rows as JSON (see history_display.history_json)."""
    hist = store.get(session) if session else History()
    return json.dumps(_finite(history_display.history_json(hist)), allow_nan=False, default=str, ensure_ascii=False)


def _finite(x: Any) -> Any:
    """JSON has no NaN: non-finite floats become null, everywhere in the answer."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x
