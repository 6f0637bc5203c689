"""Why a draft pays or not, as the page shows it (respec/anatomy.py computes it): acceptance by
draft position, the speedup's anatomy as a waterfall, and this machine's verify-cost curve.

Contract: `depth_metrics(result)` and `anatomy_metrics(result, vanilla)` are the JSON blocks of a
run's metrics (`/compare`, the metrics table); `holds_sentence(result)` says how long each
source's drafts hold, as a teacher would; `run_depth_line(result)` is the explorer's one line for
the run on screen; `anatomy_figure(runs, vanilla, metrics)` is Compare's three-panel chart
(acceptance by depth, one line per run; the waterfall from tokens per forward to the measured
speedup, with the cost model's prediction as a marker; the verify-cost curve recorded in the
trace), drawn from the runs' metrics when the caller has them; `waterfall_figure(items)` draws the
waterfall alone (the Lab's, from bench summary rows). `plain_steps(curve, n)` (respec.anatomy's) is what an
n-token tree costs in plain steps on the recorded verify-cost curve, `regime_sentence(runs)` says it for
Compare, and `decode_tokens_per_s(result)` is a run's speed with its prefill left out.

Once per result: a run's acceptance by draft position and its totals (respec/anatomy.py, each a
walk over every step) are computed once per result object (`depth_table`, `run_totals`) and
reused by every view of it (the metrics table, the chart, the explorer's line, the narration)
and by later updates (a slider move recomputes nothing). The memo is bounded (`MEMO_SIZE`
entries, least recently used out), keyed by the result's identity and step count, and holds only
weak references to results; what it returns is shared: read it, never change it. Otherwise pure
functions of results; nothing at import but the empty memo.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

import respec.anatomy as respec_anatomy      # called through the module: one place to count or stub
from app.views.plot_style import FONT, empty_figure
from app.views.text import COLORS
from respec.anatomy import DRAFT_SOURCES, DepthAcceptance, Totals, plain_steps

SOURCE_NAMES = {"eagle": "EAGLE", "retrieval": "retrieval"}
MAX_DEPTH = 8        # depths shown (deeper ones are rare and their rates noisy)
MEMO_SIZE = 64       # (kind, result) entries: a few sessions' runs on screen and their streamed partials

_memo: OrderedDict[tuple[str, int], tuple[Any, int, Any]] = OrderedDict()   # -> (weakref, steps, value)
_memo_lock = threading.Lock()          # Gradio runs events in threads


def _once_per_result(kind: str, result, compute: Callable[[Any], Any]) -> Any:
    """compute(result), or the value computed earlier for this very object with as many steps
    (a weak reference tells a live result from a new one reusing a freed one's id)."""
    key, n = (kind, id(result)), len(result.steps)
    with _memo_lock:
        hit = _memo.get(key)
        if hit is not None and hit[0]() is result and hit[1] == n:
            _memo.move_to_end(key)
            return hit[2]
    value = compute(result)
    try:
        ref = weakref.ref(result)
    except TypeError:                  # an object without weak references: computed, not kept
        return value
    with _memo_lock:
        _memo[key] = (ref, n, value)
        _memo.move_to_end(key)
        while len(_memo) > MEMO_SIZE:
            _memo.popitem(last=False)
    return value


def depth_table(result) -> DepthAcceptance:
    """The run's acceptance by draft position (respec.anatomy.acceptance_by_depth), once per result."""
    return _once_per_result("depth", result, lambda r: respec_anatomy.acceptance_by_depth(r.steps))


def run_totals(result) -> Totals:
    """The run's Totals (respec.anatomy.totals_of), once per result."""
    return _once_per_result("totals", result, respec_anatomy.totals_of)


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)


def depth_metrics(result) -> dict[str, Any]:
    """accept_at_depth[d-1] (accepted / reached draft tokens at depth d), per source, the share of
    drafting steps reaching d, and the accepted tokens a draft holds per source."""
    t = depth_table(result)
    depths = range(1, min(t.depth, MAX_DEPTH) + 1)
    return {"accept_at_depth": [_r(t.rate(d)) for d in depths],
            "accept_at_depth_by_source": {s: [_r(t.rate(d, s)) for d in depths] for s in DRAFT_SOURCES
                                          if t.drafting_steps.get(s) or t.reached.get(s)},
            "reach_depth": [_r(t.reach(d)) for d in depths],
            "drafts_hold": {s: _r(t.hold(s), 3) for s in DRAFT_SOURCES if t.hold(s) is not None}}


def anatomy_metrics(result, vanilla) -> dict[str, Any] | None:
    """The speedup's factors against `vanilla` (None without it)."""
    if vanilla is None or not vanilla.tokens or vanilla.wall_time_s <= 0 or result.wall_time_s <= 0:
        return None
    return respec_anatomy.anatomy(run_totals(result), run_totals(vanilla)).to_dict()


def holds_sentence(result) -> str:
    """"EAGLE's drafts hold for 1.40 tokens, retrieval's for 3.10" ("" when nothing was drafted)."""
    t = depth_table(result)
    held = [(SOURCE_NAMES[s], t.hold(s)) for s in DRAFT_SOURCES if t.hold(s) is not None]
    return ", ".join(f"{name}'s drafts hold for {h:.2f} tokens" if i == 0 else f"{name}'s for {h:.2f}"
                     for i, (name, h) in enumerate(held))


def run_depth_line(result) -> str:
    """One line for the run on screen: acceptance at each draft depth and how long drafts hold."""
    t = depth_table(result)
    if not t.depth:
        return "This run drafted nothing."
    rates = " · ".join(f"{d}: {t.rate(d):.0%}" for d in range(1, min(t.depth, MAX_DEPTH) + 1) if t.rate(d) is not None)
    hold = holds_sentence(result)
    return f"Accepted by draft position (this run) — {rates}" + (f"; {hold}." if hold else ".")


def anatomy_figure(runs: Sequence[tuple[str, Any]], vanilla=None, height: int = 340,
                   metrics: Sequence[Mapping[str, Any]] | None = None):
    """Compare's chart: acceptance by depth | speedup waterfall | verify-cost curve. `metrics[k]`,
    when given, is runs[k]'s `render.run_metrics` against `vanilla` (its "accept_at_depth" and
    "anatomy" are drawn; nothing is computed twice); without it they are computed here."""

    if not runs:
        return empty_figure("no runs yet", height)
    if metrics is None:
        metrics = [{**depth_metrics(r), "anatomy": anatomy_metrics(r, vanilla)} for _, r in runs]
    fig = make_subplots(rows=1, cols=3, column_widths=[0.36, 0.4, 0.24], horizontal_spacing=0.08,
                        subplot_titles=("accepted by draft position", "speedup = tokens/forward × cost",
                                        "verify cost on this machine"))
    palette = [COLORS["retrieval"], COLORS["eagle"], "#777777", COLORS["relaxed"]]
    deepest = 1
    for k, ((label, r), m) in enumerate(zip(runs, metrics)):
        ys = m["accept_at_depth"]
        if ys:
            deepest = max(deepest, len(ys))
            fig.add_trace(go.Scatter(x=list(range(1, len(ys) + 1)), y=ys, mode="lines+markers", name=label,
                                     line=dict(color=palette[k % len(palette)]), legendgroup=label), row=1, col=1)
    items = []
    for (label, r), m in zip(runs, metrics):
        a = m["anatomy"] if r is not vanilla else None
        if a is not None:
            items.append((label, a["tokens_per_forward"], a["speedup"], a.get("predicted_tokens")))
    if items:
        for trace in waterfall_traces(items):
            fig.add_trace(trace, row=1, col=2)
    else:
        _note_in_empty_panel(fig, "tick “also run vanilla” to measure it", col=2)
    curve = recorded_curve(runs)
    if curve:
        sizes = sorted(curve)
        fig.add_trace(go.Scatter(x=sizes, y=[curve[n] / curve[sizes[0]] for n in sizes], mode="lines+markers",
                                 name="ms / one-token ms", line=dict(color="#444444"), showlegend=False,
                                 hovertemplate="%{x} tokens: %{y:.2f}× a one-token forward<extra></extra>"), row=1, col=3)
    fig.update_xaxes(title_text="draft depth", dtick=1, range=[0.5, deepest + 0.5], row=1, col=1)
    fig.update_yaxes(title_text="accepted / reached", range=[0, 1.05], row=1, col=1)
    fig.update_xaxes(title_text="tree tokens", row=1, col=3)
    fig.update_yaxes(title_text="× one token", row=1, col=3)
    fig.update_layout(height=height, font=FONT, template="plotly_white", barmode="group",
                      margin=dict(l=10, r=10, t=48, b=36), legend=dict(orientation="h", y=-0.22, x=0))
    return fig


def _note_in_empty_panel(fig, text: str, col: int) -> None:
    """A note in the middle of column `col`'s panel (row 1), which has no data. plotly.js drops
    axes no trace uses, and an annotation naming a dropped axis falls back to the first panel's
    data coordinates (where it also stretched the depth axis to -2): so an empty trace keeps the
    panel's axes alive, hidden, and the note is placed in their domain."""
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", showlegend=False, hoverinfo="skip"), row=1, col=col)
    fig.update_xaxes(visible=False, row=1, col=col)
    fig.update_yaxes(visible=False, row=1, col=col)
    fig.add_annotation(text=text, showarrow=False, xref=f"x{col} domain", yref=f"y{col} domain", x=0.5, y=0.5)


def waterfall_traces(items: Sequence[tuple[str, float, float, float | None]]) -> list:
    """One waterfall per (label, tokens per forward, measured speedup, predicted tokens per step):
    tokens per forward, then the cost factor (a step's cost in plain steps, as a drop), ending at
    the measured speedup; the cost model's predicted tokens per planned step as a marker."""
    traces = []
    for label, tpf, speedup, predicted in items:
        traces.append(go.Waterfall(
            name=label, x=["tokens / forward", "× cost", "speedup"], measure=["absolute", "relative", "total"],
            y=[tpf, speedup - tpf, speedup],
            text=[f"{label}<br>{tpf:.2f}", f"×{speedup / tpf:.2f}" if tpf else "", f"{label}<br>{speedup:.2f}×"],
            textposition="outside", legendgroup=label, showlegend=False,
            connector=dict(line=dict(color="#bbbbbb"))))
        if predicted is not None:
            traces.append(go.Scatter(x=["tokens / forward"], y=[predicted], mode="markers", name=f"{label}: predicted",
                                     marker=dict(symbol="diamond-open", size=11, color="#222222"),
                                     legendgroup=label, showlegend=False,
                                     hovertemplate="cost model predicted %{y:.2f} tokens per planned step<extra></extra>"))
    return traces


def waterfall_figure(items: Sequence[tuple[str, float, float, float | None]], title: str, height: int = 380):
    """The waterfall alone (the Lab's overall rows)."""

    fig = go.Figure(waterfall_traces(items))
    fig.update_layout(title=title, height=height, font=FONT, template="plotly_white", waterfallgroupgap=0.3,
                      yaxis_title="tokens per forward → speedup")
    return fig


def recorded_curve(runs) -> dict[int, float]:
    """The verify-cost curve a trace recorded (meta "verify_cost_ms": {size: ms}), from the first
    run that has one."""
    for _, r in runs:
        raw = (r.meta or {}).get("verify_cost_ms") if hasattr(r, "meta") else None
        if isinstance(raw, dict) and raw:
            try:
                curve = {int(k): float(v) for k, v in raw.items()}
            except (TypeError, ValueError):
                continue
            if curve and min(curve.values()) > 0:
                return curve
    return {}


def regime_sentence(runs: Sequence[tuple[str, Any]]) -> str:
    """Why drafts pay (or not) on this machine, from the verify-cost curve measured at load: "On this
    machine a 4-token tree costs 1.07 plain steps and a 16-token tree 2.46: a step that verifies one
    pays when it commits more tokens than that." ("" without a curve)."""
    curve = recorded_curve(runs)
    costs = [(n, c) for n in (4, 16) if (c := plain_steps(curve, n)) is not None]
    if not costs:
        return ""
    said = " and ".join(f"a {n}-token tree {c:.2f}" if i else f"a {n}-token tree costs {c:.2f} plain steps"
                        for i, (n, c) in enumerate(costs))
    return (f"On this machine {said} (the verify-cost curve measured at load): a step that verifies "
            f"such a tree pays when it commits more tokens than that.")


def decode_tokens_per_s(result) -> float | None:
    """New tokens / (engine time - prefill): the speed without the prompt's forward, which is the
    same for every method (an EAGLE head's catch-up on the prompt counts as decoding). None when
    nothing was generated after the prefill."""
    decode_s = result.wall_time_s - result.prefill_ms / 1000.0
    n = result.stats.new_tokens
    return n / decode_s if n and decode_s > 0 else None
