"""Threshold sweeps: one method over a grid of settings on a Spec-Bench subset.

Contract: `parse_grid("theta_H=0.5,1,1.5;alpha=0.1,0.3")` -> a `Grid` (keys in the order given,
aliases resolved, every point validated through EngineConfig; ConfigError for a bad grid).
`run_sweep(runner, questions, method, base, grid, out_dir, repeats=N)` runs, per repeat and
question, vanilla and then the method at every grid point back to back, appending records to `DIR/sweep_results.jsonl` as they complete
(rerunning into DIR skips finished ones, as `bench` does), and writes:
- `DIR/sweep.csv`: one row per point: its settings, tokens/s, speedup over vanilla, mean accepted
  length, exact-match and lossless rates, ROUGE-L, NLL ratio, and `pareto` (not beaten on both
  speed and quality by another point);
- `DIR/heatmap.html`: a plotly heatmap of speedup and one of quality over the first two keys
  (bars for a one-key grid), Pareto points marked.
Quality is the NLL ratio vs vanilla (lower is better) for relaxed methods and the exact-match rate
(higher is better) for strict ones. `best_point` picks the fastest point within a quality bound.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from respec._io import atomic_write_text
from respec.config import ALIASES, EngineConfig, coerce_setting, is_lossless
from respec.errors import ConfigError
from respec.lab.bench import (RUN_FILE, Question, RecordSink, _resume_records, _run_identity, compare_to_vanilla,
                              gap_tolerance, run_question)
from respec.lab.report import summarize

MAX_POINTS = 100
RESULTS_FILE = "sweep_results.jsonl"


@dataclass(frozen=True)
class Grid:
    keys: tuple[str, ...]                  # dotted setting names, in the order given
    values: tuple[tuple[Any, ...], ...]    # per key, its values in the order given

    def points(self) -> list[dict[str, Any]]:
        return [dict(zip(self.keys, combo)) for combo in itertools.product(*self.values)]


def parse_grid(text: str, base: EngineConfig | None = None) -> Grid:
    """"k=v1,v2;k2=v3" -> Grid. Raises ConfigError naming the problem: empty grid, a part
    without '=', a key without values, a repeated or unknown key, a value out of range, or more
    than MAX_POINTS points."""
    base = base or EngineConfig()
    if not isinstance(text, str) or not text.strip():
        raise ConfigError('the grid is empty: give it as "theta_H=0.5,1,1.5;alpha=0.1,0.3"')
    keys: list[str] = []
    values: list[tuple[Any, ...]] = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        name, sep, vals = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"grid part {part!r} must look like key=v1,v2")
        key = ALIASES.get(name, name)
        if key in keys:
            raise ConfigError(f"grid key {name!r} appears twice")
        if key == "method":
            raise ConfigError("the method is not a grid key: pass --method")
        items = [v.strip() for v in vals.split(",") if v.strip()]
        if not items:
            raise ConfigError(f"grid key {name!r} has no values")
        parsed = tuple(dict.fromkeys(coerce_setting(key, v, name) for v in items))
        for v in parsed:
            base.with_overrides({key: v})          # unknown key or value out of range -> ConfigError
        keys.append(key)
        values.append(parsed)
    if not keys:
        raise ConfigError('the grid is empty: give it as "theta_H=0.5,1,1.5;alpha=0.1,0.3"')
    n = 1
    for v in values:
        n *= len(v)
    if n > MAX_POINTS:
        raise ConfigError(f"the grid has {n} points; at most {MAX_POINTS} (a sweep must stay bounded)")
    return Grid(tuple(keys), tuple(values))


def point_id(point: dict[str, Any]) -> str:
    return ";".join(f"{k}={v}" for k, v in point.items())


def quality_metric(method: str, base: EngineConfig) -> str:
    return "exact_match_rate" if is_lossless(base.with_overrides({"method": method})) else "nll_ratio"


def pareto_front(rows: Sequence[dict], quality: str) -> list[bool]:
    """Whether each row is not dominated: no other row at least as fast and at least as good,
    and better in one. Quality: higher exact_match_rate, lower nll_ratio."""
    sign = -1.0 if quality == "nll_ratio" else 1.0

    def q(r):
        v = r.get(quality)
        return float("-inf") if v is None or v != v else sign * v
    out = []
    for r in rows:
        dominated = any(o is not r and o["speedup_vs_vanilla"] >= r["speedup_vs_vanilla"] and q(o) >= q(r)
                        and (o["speedup_vs_vanilla"] > r["speedup_vs_vanilla"] or q(o) > q(r)) for o in rows)
        out.append(not dominated)
    return out


def best_point(rows: Sequence[dict], quality: str, bound: float) -> dict | None:
    """The fastest row whose quality is within the bound (nll_ratio <= bound, or exact_match_rate
    >= bound), or None."""
    ok = [r for r in rows if r.get(quality) is not None and r[quality] == r[quality]
          and (r[quality] <= bound if quality == "nll_ratio" else r[quality] >= bound)]
    return max(ok, key=lambda r: r["speedup_vs_vanilla"]) if ok else None


def sweep_rows(records: "pandas.DataFrame", grid: Grid, quality: str) -> list[dict]:
    """One row per grid point (overall over the questions), with its settings and the Pareto flag."""
    import pandas as pd
    rows = []
    vanilla = records[records.method == "vanilla"]
    for point in grid.points():
        part = records[records.point == point_id(point)]
        if part.empty:
            continue
        s = summarize(pd.concat([vanilla, part.assign(method="method")]))
        r = s[(s.category == "overall") & (s.method == "method")].iloc[0].to_dict()
        rows.append({**point, **{k: r[k] for k in ("tokens_per_s", "speedup_vs_vanilla", "mean_accepted",
                                                   "exact_match_rate", "lossless_rate", "rouge_l_vs_vanilla",
                                                   "nll_ratio", "retrieval_step_share", "trigger_rate")},
                     "questions": int(r["questions"])})
    for r, front in zip(rows, pareto_front(rows, quality)):
        r["pareto"] = front
    return rows


def heatmap_figure(rows: Sequence[dict], grid: Grid, quality: str, method: str):
    """Speedup and quality over the grid's first two keys (bars for one key); Pareto points ringed."""
    from plotly.subplots import make_subplots

    qname = "NLL ratio vs vanilla (lower is better)" if quality == "nll_ratio" else "exact-match rate vs vanilla"
    fig = make_subplots(rows=1, cols=2, subplot_titles=("speedup over vanilla", qname), horizontal_spacing=0.12)
    kx = grid.keys[0]
    xs = [str(v) for v in grid.values[0]]
    if len(grid.keys) == 1:
        for col, metric in ((1, "speedup_vs_vanilla"), (2, quality)):
            fig.add_bar(x=[str(r[kx]) for r in rows], y=[r[metric] for r in rows], showlegend=False,
                        marker_color=["#D55E00" if r["pareto"] else "#0072B2" for r in rows],
                        text=[f"{r[metric]:.2f}" for r in rows], textposition="outside", row=1, col=col)
            fig.update_xaxes(title_text=kx, row=1, col=col)
    else:
        ky = grid.keys[1]
        ys = [str(v) for v in grid.values[1]]

        def cell(metric, x, y):
            vals = [r[metric] for r in rows if str(r[kx]) == x and str(r[ky]) == y]
            return sum(vals) / len(vals) if vals else None       # extra keys are averaged over
        for col, metric, scale in ((1, "speedup_vs_vanilla", "Viridis"),
                                   (2, quality, "Viridis_r" if quality == "nll_ratio" else "Viridis")):
            z = [[cell(metric, x, y) for x in xs] for y in ys]
            fig.add_heatmap(x=xs, y=ys, z=z, colorscale=scale, texttemplate="%{z:.2f}", showscale=False,
                            row=1, col=col)
            front = [r for r in rows if r["pareto"]]
            fig.add_scatter(x=[str(r[kx]) for r in front], y=[str(r[ky]) for r in front], mode="markers",
                            marker=dict(symbol="circle-open", size=26, color="#D55E00", line=dict(width=3)),
                            name="Pareto front", showlegend=col == 1, row=1, col=col)
            fig.update_xaxes(title_text=kx, type="category", row=1, col=col)
            fig.update_yaxes(title_text=ky, type="category", row=1, col=col)
    fig.update_layout(title=f"{method} sweep (Pareto points marked)", template="plotly_white", height=480)
    return fig


def run_sweep(runner, questions: list[Question], method: str, base: EngineConfig, grid: Grid, out_dir: str | Path,
              progress: bool = True, fresh: bool = False, on_record: Callable[[dict], None] | None = None,
              should_stop: Callable[[], bool] | None = None, guard: Callable[[], Any] | None = None,
              repeats: int = 1) -> list[dict]:
    """Per repeat and question: vanilla, then `method` at every grid point, back to back (so a slow
    drift of the machine moves a question's vanilla and its points together; each point is
    compared to the vanilla run of its own question and repeat); resumable (a larger `repeats` adds
    the missing ones); returns sweep rows, speedups as ratios of means over the repeats.
    `on_record` gets every new record; `should_stop()` True ends the run early; each record runs
    inside `guard()` (as in run_bench)."""
    import pandas as pd
    from tqdm import tqdm

    if method == "vanilla":
        raise ConfigError("sweep a speculative method (vanilla is the reference it is compared to)")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be an integer >= 1, got {repeats!r}")
    out_dir = Path(out_dir)
    identity = {**_run_identity(runner, base), "method": method, "grid": [list(grid.keys), [list(v) for v in grid.values]]}
    done = [r for r in _resume_records(out_dir, identity, fresh, RESULTS_FILE) if "point" in r]
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / RUN_FILE, json.dumps(identity, indent=1, default=str))
    by_key = {(r["point"], r["question_id"], r.setdefault("repeat", 0)): r for r in done}
    tol = gap_tolerance(str(runner.target.dtype))
    quality = quality_metric(method, base)
    jobs = [("vanilla", None)] + [(point_id(p), p) for p in grid.points()]
    order = [(k, q, pid, point) for k in range(repeats) for q in questions for pid, point in jobs]
    records: list[dict] = []
    atomic_write_text(out_dir / RESULTS_FILE, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in done))
    with (out_dir / RESULTS_FILE).open("a", encoding="utf-8") as fh, \
            tqdm(total=len(order), initial=sum(1 for k, q, pid, _ in order if (pid, q.question_id, k) in by_key),
                 desc=f"sweep {method}", unit="run", disable=not progress, file=sys.stderr) as bar:
        sink = RecordSink(fh, bar, on_record)
        for k, q, pid, point in order:
            rec = by_key.get((pid, q.question_id, k))
            if rec is None:
                if should_stop is not None and should_stop():
                    break
                bar.set_postfix_str(f"q{q.question_id} {pid}" + (f" #{k + 1}" if repeats > 1 else ""))
                cfg = base.with_overrides({"method": "vanilla"} if point is None else {**point, "method": method})
                with (guard or contextlib.nullcontext)():
                    rec = run_question(runner, q, cfg, score_nll=quality == "nll_ratio", keep_margins=point is None)
                rec = compare_to_vanilla(rec, rec if point is None else by_key[("vanilla", q.question_id, k)], tol)
                rec.update(point=pid, repeat=k)
                by_key[(pid, q.question_id, k)] = rec
                sink.add(rec)
            records.append(rec)
    rows = sweep_rows(pd.DataFrame(records), grid, quality)
    atomic_write_text(out_dir / "sweep.csv", pd.DataFrame(rows).to_csv(index=False, float_format="%.4f"))
    fig = heatmap_figure(rows, grid, quality, method)
    atomic_write_text(out_dir / "heatmap.html", fig.to_html(include_plotlyjs=True, full_html=True))
    return rows


def sweep_markdown(rows: Sequence[dict], grid: Grid, quality: str) -> str:
    cols = list(grid.keys) + ["speedup_vs_vanilla", "mean_accepted", quality, "lossless_rate", "pareto"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r[c]
            cells.append(("yes" if v else "") if c == "pareto" else f"{v:.2f}x" if c == "speedup_vs_vanilla"
                         else f"{v:.3f}" if isinstance(v, float) and c not in grid.keys else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
