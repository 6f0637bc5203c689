"""Run history for tuning thresholds by hand: one row per Compare run, a pinned baseline "A", the
deltas of later runs against it, and the median and spread of repeated runs.

Contract: pure Python over plain values (no Gradio, no model; the only I/O is `write_csv`, which
writes the one path it is given). Inputs are the JSON-ready metrics of `render.run_metrics`
(the page computes them from its finished runs, the API reads them from `/compare`'s metrics JSON),
one dict per repeat and column ("respec", "eagle", "vanilla"), plus the output token ids.

* `MethodEntry`: one column of one row. tokens/s is kept per repeat (`median`, `low`, `high`);
  speedup is the median over repeats, "measured" when vanilla ran in the same run, else
  "estimated"; MAT (mean accepted length), trigger rate, retrieval share (steps drafted by
  retrieval / steps, as in `respec bench`), relaxed tokens and "equal to vanilla" come from the last
  repeat (greedy repeats write the same tokens: only timing varies).
* `HistoryRow`: number (1, 2, … within a session), time, prompt, model, every control's value
  (`settings`, what "restore A's settings" puts back), the settings that differ from the device
  defaults (`changed`), repeats and the entries.
* `History`: at most `max_rows` rows (oldest dropped first; RESPEC_MAX_HISTORY, default 50); the
  pinned row "A" is kept even after it leaves the table; `clear()` empties it and restarts the
  numbering. `compare_rows(a, b)` gives the deltas of b against a per column, with a noise verdict:
  "within" when the tokens/s ranges (min–max over repeats) of a and b overlap, "outside" when they
  do not, None when neither was repeated (two single timings cannot tell noise from a change).
* `HistoryStore`: histories keyed by an API client's session, least recently used dropped first.
* Views: `records` (flat, unrounded: CSV and /history), `table` (rounded, for the page),
  `history_figure` (plotly: tokens/s or MAT against run number, coloured by the settings that
  differ from the defaults), `summary_html` (the latest run, and its deltas against A).
"""
from __future__ import annotations

import array
import html
import math
import os
import statistics
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from app.settings import SPEC_BY_KEY, SPECS, Caps, non_default

#: Columns in display order and their names in the table.
COLUMNS: tuple[str, ...] = ("respec", "eagle", "vanilla")
COLUMN_NAMES = {"respec": "ReSpec", "eagle": "EAGLE-2", "vanilla": "vanilla"}
DEFAULT_MAX_ROWS = 50
METRIC_CHOICES = ("tokens/s", "MAT")

#: What the page says next to the history (issue 20): which numbers to trust on a noisy machine.
NOISE_NOTE = ("tokens/s moves by about ±10% from run to run on a shared CPU: use **repeat ×N** and compare "
              "medians, and read a delta against A as noise while it is within the spread. **MAT, trigger "
              "rate and retrieval share do not depend on machine noise** (greedy runs draft and accept the "
              "same tokens every time): they are the better guide for thresholds that change *what* is "
              "drafted (θ_H, L_min, θ_score, K, L_max …).")


def max_rows_from_env() -> int:
    """RESPEC_MAX_HISTORY: rows a session's history keeps (default 50)."""
    from app.settings import _env_int
    return _env_int("RESPEC_MAX_HISTORY", DEFAULT_MAX_ROWS)


# ------------------------------------------------------------------------------- rows
@dataclass(frozen=True)
class MethodEntry:
    column: str                              # "respec" | "eagle" | "vanilla"
    method: str                              # the engine method that ran in this column
    tokens_per_s: tuple[float, ...]          # one per repeat
    speedup: float | None                    # median over repeats
    speedup_kind: str                        # "measured" (vanilla ran) | "estimated"
    mean_accepted_length: float
    trigger_rate: float | None               # None: the method has no entropy trigger
    retrieval_share: float | None            # steps drafted by retrieval / steps (None: no steps)
    relaxed_tokens: int
    new_tokens: int
    equal_to_vanilla: bool | None            # None: vanilla did not run
    tokens: array.array = field(default_factory=lambda: array.array("i"), repr=False)   # output ids (diff)

    @property
    def repeats(self) -> int:
        return len(self.tokens_per_s)

    @property
    def median(self) -> float:
        return float(statistics.median(self.tokens_per_s)) if self.tokens_per_s else 0.0

    @property
    def low(self) -> float:
        return min(self.tokens_per_s) if self.tokens_per_s else 0.0

    @property
    def high(self) -> float:
        return max(self.tokens_per_s) if self.tokens_per_s else 0.0

    @property
    def spread(self) -> float | None:
        """max − min of tokens/s over the repeats (None for a single run)."""
        return self.high - self.low if self.repeats > 1 else None

    @property
    def spread_pct(self) -> float | None:
        """Half the spread as a percentage of the median (the "±" of the page)."""
        if self.spread is None or self.median <= 0:
            return None
        return 50.0 * self.spread / self.median


@dataclass(frozen=True)
class HistoryRow:
    number: int
    time: str                                # wall-clock "HH:MM:SS" of the run's end
    prompt: str
    model: str
    settings: dict[str, Any]                 # every control's value (SPECS keys + "tree.auto")
    changed: dict[str, Any]                  # the settings that differ from the device defaults
    entries: dict[str, MethodEntry]          # by column, in COLUMNS order
    source: str = "page"                     # "page" | "api"

    @property
    def repeats(self) -> int:
        return max((e.repeats for e in self.entries.values()), default=0)

    @property
    def label(self) -> str:
        """The settings that differ from the defaults, short ("θ_H=1.5, L_min=3" or "defaults")."""
        return settings_label(self.changed)

    def choice(self) -> str:
        """How the pin picker names this row."""
        return f"#{self.number} · {self.time} · {self.label}"


def short_name(key: str) -> str:
    """A setting's short name: the label of its control without the unit ("θ_H", "L_min", "auto")."""
    if key == "tree.auto":
        return "auto"
    spec = SPEC_BY_KEY.get(key)
    return spec.label.split(" (")[0] if spec is not None else key


def _fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def settings_label(changed: Mapping[str, Any]) -> str:
    return ", ".join(f"{short_name(k)}={_fmt_value(v)}" for k, v in changed.items()) or "defaults"


def changed_settings(settings: Mapping[str, Any], device: str = "cpu", caps: Caps | None = None) -> dict[str, Any]:
    """The settings that differ from the device defaults (what the page's preset "device defaults"
    would set), in the order of the settings panel."""
    diff = non_default(settings, device, caps)
    order = [s.key for s in SPECS] + ["tree.auto"]
    return {k: diff[k] for k in order if k in diff} | {k: v for k, v in diff.items() if k not in order}


def settings_changes(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, value in a, value in b) for every setting whose value differs between two rows."""
    from app.settings import _num_eq
    return [(k, a.get(k), b.get(k)) for k in dict.fromkeys([*a, *b]) if not _num_eq(a.get(k), b.get(k))]


def _retrieval_share(m: Mapping[str, Any]) -> float | None:
    steps = m.get("steps") or 0
    if not steps:
        return None
    return (m.get("steps_by_source") or {}).get("retrieval", 0) / steps


def _median(values: Iterable[float | None]) -> float | None:
    vals = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return float(statistics.median(vals)) if vals else None


def entry_from_metrics(column: str, repeats: Sequence[Mapping[str, Any]], tokens: Sequence[int] = (),
                       equal_to_vanilla: bool | None = None) -> MethodEntry:
    """One column's entry from its `render.run_metrics` dicts, one per repeat (at least one)."""
    if not repeats:
        raise ValueError("an entry needs the metrics of at least one run")
    last = repeats[-1]
    kinds = {m.get("speedup_kind") for m in repeats}
    return MethodEntry(
        column=column, method=str(last.get("method", column)),
        tokens_per_s=tuple(float(m.get("tokens_per_s") or 0.0) for m in repeats),
        speedup=_median(m.get("speedup") for m in repeats),
        speedup_kind="measured" if kinds == {"measured"} else "estimated",
        mean_accepted_length=float(last.get("mean_accepted_length") or 0.0),
        trigger_rate=last.get("trigger_rate"), retrieval_share=_retrieval_share(last),
        relaxed_tokens=int(last.get("relaxed_tokens") or 0), new_tokens=int(last.get("new_tokens") or 0),
        equal_to_vanilla=equal_to_vanilla, tokens=array.array("i", [int(t) for t in tokens]))


def build_row(prompt: str, model: str, settings: Mapping[str, Any], changed: Mapping[str, Any],
              metrics: Mapping[str, Sequence[Mapping[str, Any]]], tokens: Mapping[str, Sequence[int]],
              time: str, source: str = "page", equal_to_vanilla: Mapping[str, bool] | None = None) -> HistoryRow:
    """A row (number 0: `History.add` numbers it) from each column's metrics per repeat and its
    output tokens. "Equal to vanilla" comes from `equal_to_vanilla` when given (the API's metrics
    say it), else from comparing tokens with vanilla's when vanilla ran."""
    vanilla = tokens.get("vanilla") if "vanilla" in metrics else None
    entries = {}
    for col in COLUMNS:
        if col not in metrics or not metrics[col]:
            continue
        toks = list(tokens.get(col, ()))
        if equal_to_vanilla is not None and col in equal_to_vanilla:
            eq = bool(equal_to_vanilla[col])
        else:
            eq = None if vanilla is None else toks == list(vanilla)
        entries[col] = entry_from_metrics(col, metrics[col], toks, eq)
    return HistoryRow(number=0, time=time, prompt=str(prompt), model=str(model), settings=dict(settings),
                      changed=dict(changed), entries=entries, source=source)


# ------------------------------------------------------------------------------- deltas
@dataclass(frozen=True)
class MethodDelta:
    column: str
    tps_a: float                              # median tokens/s of A
    tps_b: float                              # median tokens/s of the later run
    change_pct: float | None                  # (b − a) / a in %
    noise: str | None                         # "within" | "outside" the spread | None (neither repeated)
    mat_a: float
    mat_b: float
    identical: bool                           # same output tokens
    first_difference: int | None              # index of the first differing token (None if identical)


@dataclass(frozen=True)
class Delta:
    a: HistoryRow
    b: HistoryRow
    methods: dict[str, MethodDelta]
    settings: list[tuple[str, Any, Any]]     # (key, value in A, value in B)


def noise_verdict(a: MethodEntry, b: MethodEntry) -> str | None:
    """"within" when the tokens/s ranges of the two rows overlap, "outside" when they do not; None
    when neither was repeated (a single run has no spread to compare with)."""
    if a.repeats < 2 and b.repeats < 2:
        return None
    return "within" if a.low <= b.high and b.low <= a.high else "outside"


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    a, b = list(a), list(b)
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def compare_rows(a: HistoryRow, b: HistoryRow) -> Delta:
    """The deltas of row b against row a, for every column both ran."""
    out = {}
    for col in COLUMNS:
        ea, eb = a.entries.get(col), b.entries.get(col)
        if ea is None or eb is None:
            continue
        first = first_difference(ea.tokens, eb.tokens)
        out[col] = MethodDelta(
            column=col, tps_a=ea.median, tps_b=eb.median,
            change_pct=100.0 * (eb.median - ea.median) / ea.median if ea.median > 0 else None,
            noise=noise_verdict(ea, eb), mat_a=ea.mean_accepted_length, mat_b=eb.mean_accepted_length,
            identical=first is None, first_difference=first)
    return Delta(a=a, b=b, methods=out, settings=settings_changes(a.settings, b.settings))


# ------------------------------------------------------------------------------- the history
@dataclass
class History:
    max_rows: int = field(default_factory=max_rows_from_env)
    rows: list[HistoryRow] = field(default_factory=list)
    pinned: HistoryRow | None = None
    next_number: int = 1

    def add(self, row: HistoryRow) -> HistoryRow:
        """Number the row, append it, and drop the oldest rows beyond `max_rows`."""
        row = replace(row, number=self.next_number)
        self.next_number += 1
        self.rows.append(row)
        del self.rows[:max(0, len(self.rows) - max(1, self.max_rows))]
        return row

    def get(self, number: int) -> HistoryRow | None:
        try:
            number = int(number)
        except (TypeError, ValueError):
            return None
        if self.pinned is not None and self.pinned.number == number:
            return self.pinned
        return next((r for r in self.rows if r.number == number), None)

    def pin(self, number: int) -> HistoryRow:
        """Pin row `number` as the baseline A (KeyError if there is no such row)."""
        row = self.get(number)
        if row is None:
            raise KeyError(f"no run #{number} in the history")
        self.pinned = row
        return row

    def unpin(self) -> None:
        self.pinned = None

    def clear(self) -> None:
        self.rows.clear()
        self.pinned = None
        self.next_number = 1

    @property
    def latest(self) -> HistoryRow | None:
        return self.rows[-1] if self.rows else None

    def delta(self, row: HistoryRow | None = None) -> Delta | None:
        """Deltas of `row` (default: the latest) against A; None without A or when row is A."""
        row = row or self.latest
        if self.pinned is None or row is None or row.number == self.pinned.number:
            return None
        return compare_rows(self.pinned, row)


class HistoryStore:
    """Histories of API clients, keyed by their session, least recently used dropped beyond
    `capacity` (the page keeps its history in the tab's session state instead)."""

    def __init__(self, capacity: int = 300, max_rows: int | None = None) -> None:
        self.capacity = max(1, int(capacity))
        self.max_rows = max_rows
        self._by_key: OrderedDict[str, History] = OrderedDict()

    def get(self, key: str) -> History:
        key = str(key)
        hist = self._by_key.pop(key, None)
        if hist is None:
            hist = History() if self.max_rows is None else History(max_rows=self.max_rows)
        self._by_key[key] = hist
        while len(self._by_key) > self.capacity:
            self._by_key.popitem(last=False)
        return hist

    def __len__(self) -> int:
        return len(self._by_key)


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

    from app.figures import FONT, empty_figure
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
        changes = ", ".join(f"{short_name(k)} {_fmt_value(a)} → {_fmt_value(b)}" for k, a, b in d.settings) \
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
