"""The run history's views: the page's table and plot, the summary against A, the CSV export and
the `/history` JSON (the rows themselves live in `app.session.history`).

Contract: functions of a `History` (and its rows and deltas) returning plain values: `records`
(flat, unrounded: CSV and /history), `table` (pandas, rounded, newest first, for the page),
`history_figure` (plotly: tokens/s or MAT against the run number, coloured by the settings that
differ from the defaults), `summary_html` (the latest run, and its deltas against A),
`history_json` (the /history answer). No Gradio; the only I/O is `write_csv`, which writes the
one path it is given.
"""
from __future__ import annotations

import html
import math
import os
from typing import Any

from app.session.history import COLUMN_NAMES, COLUMNS, Delta, History, MethodEntry, fmt_value, short_name
from app.views.figures import FONT, empty_figure

#: What the history plot can show against the run number.
METRIC_CHOICES = ("tokens/s", "MAT")

#: What the page says next to the history (issue 20): which numbers to trust on a noisy machine.
NOISE_NOTE = ("tokens/s moves by about ±10% from run to run on a shared CPU: use **repeat ×N** and compare "
              "medians, and read a delta against A as noise while it is within the spread. **MAT, trigger "
              "rate and retrieval share do not depend on machine noise** (greedy runs draft and accept the "
              "same tokens every time): they are the better guide for thresholds that change *what* is "
              "drafted (θ_H, L_min, θ_score, K, L_max …).")


# ------------------------------------------------------------------------------- views
def _num(x: float | None, digits: int) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else round(float(x), digits)


def records(history: History, digits: int | None = None) -> list[dict[str, Any]]:
    """One flat dict per row (columns stable across rows; values unrounded unless `digits`)."""
    rnd = (lambda x, d: _num(x, d)) if digits is not None else (lambda x, d: _num(x, 12))
    cols = [c for c in COLUMNS if any(c in r.entries for r in history.rows)]
    out = []
    for r in history.rows:
        rec: dict[str, Any] = {"A": "A" if history.pinned is not None and history.pinned.number == r.number else "",
                               "run": r.number, "time": r.time, "prompt": short_prompt(r.prompt),
                               "settings ≠ defaults": r.label, "repeats": r.repeats}
        for col in cols:
            e = r.entries.get(col)
            name = COLUMN_NAMES[col]
            rec[f"{name} tok/s"] = rnd(e.median, 1) if e else None
            rec[f"{name} tok/s spread"] = rnd(e.spread, 1) if e else None
            if col != "vanilla":
                rec[f"{name} speedup"] = rnd(e.speedup, 2) if e else None
                rec[f"{name} speedup kind"] = e.speedup_kind if e else None
                rec[f"{name} MAT"] = rnd(e.mean_accepted_length, 2) if e else None
                rec[f"{name} trigger rate"] = rnd(e.trigger_rate, 2) if e else None
                rec[f"{name} retrieval share"] = rnd(e.retrieval_share, 2) if e else None
                rec[f"{name} relaxed tokens"] = e.relaxed_tokens if e else None
                rec[f"{name} = vanilla"] = ("" if e is None or e.equal_to_vanilla is None
                                            else "yes" if e.equal_to_vanilla else "no")
        out.append(rec)
    return out


def table(history: History):
    """The page's table (pandas), newest run first, numbers rounded for reading."""
    import pandas as pd
    recs = records(history, digits=2)
    if not recs:
        return pd.DataFrame({"run": [], "settings ≠ defaults": [], "ReSpec tok/s": [], "ReSpec MAT": []})
    df = pd.DataFrame(recs[::-1])
    keep = [c for c in df.columns if c in ("A", "run", "time", "prompt", "settings ≠ defaults", "repeats")
            or df[c].notna().any()]             # e.g. spreads before any repeat, EAGLE-2's trigger rate
    return df[keep]


def write_csv(history: History, path: str) -> str:
    """Every row (unrounded, oldest first) as CSV at `path`; returns the path."""
    import pandas as pd
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pd.DataFrame(records(history)).to_csv(path, index=False)
    return path


def short_prompt(prompt: str, width: int = 48) -> str:
    text = " ".join(str(prompt).split())
    return text if len(text) <= width else text[:width - 1] + "…"


def entry_json(e: MethodEntry) -> dict[str, Any]:
    return {"method": e.method, "tokens_per_s": e.median, "tokens_per_s_runs": list(e.tokens_per_s),
            "tokens_per_s_spread": e.spread, "speedup": e.speedup, "speedup_kind": e.speedup_kind,
            "mean_accepted_length": e.mean_accepted_length, "trigger_rate": e.trigger_rate,
            "retrieval_share": e.retrieval_share, "relaxed_tokens": e.relaxed_tokens,
            "new_tokens": e.new_tokens, "equal_to_vanilla": e.equal_to_vanilla}


def delta_json(d: Delta) -> dict[str, Any]:
    return {"against": d.a.number,
            "settings": [{"key": k, "A": a, "this": b} for k, a, b in d.settings],
            "methods": {c: {"tokens_per_s_A": m.tps_a, "tokens_per_s": m.tps_b, "change_pct": m.change_pct,
                            "noise": m.noise, "mat_A": m.mat_a, "mat": m.mat_b, "identical_output": m.identical,
                            "first_difference": m.first_difference} for c, m in d.methods.items()}}


def history_json(history: History) -> dict[str, Any]:
    """The /history answer: rows (oldest first) with settings and per-column metrics, the pinned run,
    and each later row's deltas against it."""
    rows = []
    for r in history.rows:
        rec = {"run": r.number, "time": r.time, "prompt": r.prompt, "model": r.model, "source": r.source,
               "repeats": r.repeats, "changed": r.changed, "settings": r.settings,
               "methods": {c: entry_json(e) for c, e in r.entries.items()}}
        d = history.delta(r) if history.pinned is not None and r.number > history.pinned.number else None
        if d is not None:
            rec["delta_vs_A"] = delta_json(d)
        rows.append(rec)
    return {"rows": rows, "pinned": history.pinned.number if history.pinned else None,
            "max_rows": history.max_rows}


def history_figure(history: History, metric: str = "tokens/s", height: int = 320):
    """tokens/s (median, whiskers = min–max over repeats) or MAT against the run number; colour =
    the settings that differ from the defaults, marker = column; A is ringed."""
    import plotly.graph_objects as go

    if not history.rows:
        return empty_figure("no runs yet: every Run adds a point", height)
    mat = metric == "MAT"
    palette = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442", "#000000"]
    symbols = {"respec": "circle", "eagle": "diamond", "vanilla": "square"}
    labels = list(dict.fromkeys(r.label for r in history.rows))
    fig = go.Figure()
    for col in COLUMNS:                     # a faint line per column, so the eye follows one method
        pts = [(r.number, r.entries[col]) for r in history.rows if col in r.entries]
        if not pts or (mat and col == "vanilla"):
            continue
        fig.add_trace(go.Scatter(x=[n for n, _ in pts], y=[e.mean_accepted_length if mat else e.median for _, e in pts],
                                 mode="lines", line=dict(color="#bbbbbb", width=1), hoverinfo="skip",
                                 showlegend=False))
    for k, label in enumerate(labels):
        for col in COLUMNS:
            pts = [(r, r.entries[col]) for r in history.rows if r.label == label and col in r.entries]
            if not pts or (mat and col == "vanilla"):
                continue
            ys = [e.mean_accepted_length if mat else e.median for _, e in pts]
            err = None if mat else dict(type="data", symmetric=False, array=[e.high - e.median for _, e in pts],
                                        arrayminus=[e.median - e.low for _, e in pts], thickness=1.2, width=4)
            fig.add_trace(go.Scatter(
                x=[r.number for r, _ in pts], y=ys, mode="markers", error_y=err,
                name=f"{label} · {COLUMN_NAMES[col]}", legendgroup=label,
                marker=dict(color=palette[k % len(palette)], symbol=symbols[col], size=11,
                            line=dict(width=3 if history.pinned else 0,
                                      color=["#222222" if history.pinned and r.number == history.pinned.number
                                             else "rgba(0,0,0,0)" for r, _ in pts])),
                hovertemplate=f"run %{{x}} · {COLUMN_NAMES[col]}<br>{html.escape(label)}<br>"
                              + ("MAT %{y:.2f}" if mat else "%{y:.1f} tok/s (median)") + "<extra></extra>"))
    fig.update_layout(height=height, font=FONT, template="plotly_white", margin=dict(l=50, r=10, t=30, b=40),
                      xaxis=dict(title="run", dtick=1), yaxis=dict(title="mean accepted length" if mat else
                                                                  "tokens/s", rangemode="tozero"),
                      legend=dict(orientation="h", y=-0.25, x=0), uirevision="history")
    return fig


def timing_text(e: MethodEntry) -> str:
    """"41.3 tok/s" or "median 41.3 tok/s, spread 39.8–43.0 (±3.9%) over 3 runs"."""
    if e.repeats < 2:
        return f"{e.median:.1f} tok/s"
    return (f"median {e.median:.1f} tok/s, spread {e.low:.1f}–{e.high:.1f} (±{e.spread_pct:.1f}%) "
            f"over {e.repeats} runs")


def summary_html(history: History) -> str:
    """The latest run in words (timing with median and spread when repeated), then its deltas
    against A when a baseline is pinned."""
    row = history.latest
    if row is None:
        return "<div class='respec-metrics respec-history'><em>No runs yet: every Run adds a row below.</em></div>"
    esc = html.escape
    parts = [f"<div class='respec-metrics respec-history'><b>Run #{row.number}</b> ({esc(row.label)}): "
             + "; ".join(f"{COLUMN_NAMES[c]} {esc(timing_text(e))}" for c, e in row.entries.items())]
    d = history.delta(row)
    if history.pinned is None:
        parts.append("<div class='note'>Pin a run as <b>A</b> to see later runs' deltas against it.</div>")
    elif d is None:
        parts.append(f"<div class='note'>Run #{row.number} is <b>A</b>: later runs show their deltas against it.</div>")
    else:
        changes = ", ".join(f"{short_name(k)} {fmt_value(a)} → {fmt_value(b)}" for k, a, b in d.settings) \
            or "same settings"
        head = ("<tr><th></th><th>tokens/s A → now</th><th>noise</th><th>MAT A → now</th><th>output</th></tr>")
        body = []
        for c, m in d.methods.items():
            ea, eb = d.a.entries[c], d.b.entries[c]
            verdict = {"within": f"within the spread (A {ea.low:.1f}–{ea.high:.1f}, now {eb.low:.1f}–{eb.high:.1f})",
                       "outside": f"outside the spread (A {ea.low:.1f}–{ea.high:.1f}, now {eb.low:.1f}–{eb.high:.1f})",
                       None: "single runs: ±10% is common noise here, repeat ×N to tell"}[m.noise]
            out = "identical" if m.identical else f"differs from token {m.first_difference}"
            body.append(f"<tr><th>{COLUMN_NAMES[c]}</th><td>{m.tps_a:.1f} → {m.tps_b:.1f} "
                        f"({'–' if m.change_pct is None else f'{m.change_pct:+.1f}%'})</td>"
                        f"<td>{esc(verdict)}</td><td>{m.mat_a:.2f} → {m.mat_b:.2f} ({m.mat_b - m.mat_a:+.2f})</td>"
                        f"<td>{out}</td></tr>")
        parts.append(f"<div><b>vs A = run #{d.a.number}</b> ({esc(changes)})</div>"
                     f"<table><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>")
    parts.append("</div>")
    return "".join(parts)
