"""Spec-Bench reports: per-category summary of bench records, markdown tables, plotly figures.

Contract (Spec-Bench's speed.py conventions): `summarize(records)` gives per-category and overall
rows per method: `tokens_per_s` is the mean of per-question speeds; `speedup_vs_vanilla` is a ratio
of means over every repeat; `decode_tokens_per_s` / `decode_speedup` the same with each record's
prefill (the prompt's forward) taken out of its wall time (`decode_tokens_per_s`); with several repeats, `speedup_std` / `speedup_min` / `speedup_max`
spread the per-repeat speedups (each repeat's mean tokens/s over vanilla's in the same repeat;
sample std, NaN for one repeat); `speedup_same_length` compares each question at the length its
output shares with vanilla's (`same_length_speedup`: outputs that end at different lengths, as bf16
rounding ties and relaxed verification allow, otherwise spread one prompt's prefill over different
token counts); `mean_accepted` = committed tokens per target forward over all steps
(bonus token included); `exact_match_rate` / `lossless_rate` are shares of questions (see respec.lab.bench).
`write_reports` writes summary.csv, summary.md, speedup.html and acceptance.html into a results
folder, each atomically (respec._io). Pure functions of their inputs otherwise; pandas and plotly
are imported when called.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from respec._io import atomic_write_text
from respec.anatomy import DepthAcceptance, Totals, anatomy
from respec.lab.questions import CATEGORIES


def add_hist(total: list[int], part: Sequence[int]) -> None:
    """Add the accepted-length histogram `part` into `total` in place (extending it as needed)."""
    total.extend([0] * (len(part) - len(total)))
    for i, n in enumerate(part):
        total[i] += n


def write_reports(summary: "pandas.DataFrame", records: "pandas.DataFrame", out_dir: str | Path) -> None:
    """summary.csv, summary.md (every column), speedup.html (speedup per category and method) and
    acceptance.html (accepted-length histograms per method), each written atomically; the HTML
    embeds plotly.js, so the charts open offline."""
    out_dir = Path(out_dir)
    atomic_write_text(out_dir / "summary.csv", summary.to_csv(index=False, float_format="%.4f"))
    atomic_write_text(out_dir / "summary.md", "Speedup over vanilla (mean accepted length, bonus included):\n\n"
                      + speedup_matrix_markdown(summary) + "\n\nEvery metric:\n\n" + summary_table_markdown(summary) + "\n")
    figs = bench_figures(summary, records)
    for name, fig in figs.items():
        atomic_write_text(out_dir / f"{name}.html", fig.to_html(include_plotlyjs=True, full_html=True))


def bench_figures(summary: "pandas.DataFrame", records: "pandas.DataFrame") -> dict:
    """Plotly figures: grouped bars of speedup per category and method; accepted-length histograms
    (share of steps that accepted k draft tokens, per engine method)."""
    import plotly.graph_objects as go

    speed = go.Figure()
    for method in dict.fromkeys(summary.method):
        part = summary[summary.method == method]
        speed.add_bar(name=method, x=list(part.category), y=list(part.speedup_vs_vanilla),
                      text=[f"{v:.2f}x" for v in part.speedup_vs_vanilla], textposition="outside")
    speed.update_layout(title="Speedup over vanilla (ratio of mean tokens/s)", barmode="group",
                        yaxis_title="speedup", xaxis_title="category", template="plotly_white")
    speed.add_hline(y=1.0, line_dash="dot", line_color="gray")
    if "speedup_min" in summary and (summary.get("repeats", 1) > 1).any():
        for trace, method in zip(speed.data, dict.fromkeys(summary.method)):
            part = summary[summary.method == method]
            trace.error_y = dict(type="data", symmetric=False,
                                 array=list((part.speedup_max - part.speedup_vs_vanilla).fillna(0)),
                                 arrayminus=list((part.speedup_vs_vanilla - part.speedup_min).fillna(0)))
        speed.update_layout(title="Speedup over vanilla (ratio of mean tokens/s; bars span the per-repeat min-max)")
    acc = go.Figure()
    if "accept_hist" in records:
        for method, g in records.groupby("method", sort=False):
            total: list[int] = []
            for h in g.accept_hist:
                add_hist(total, h or [])
            if not total or method == "vanilla":
                continue
            n = sum(total)
            acc.add_bar(name=method, x=list(range(len(total))), y=[c / n for c in total])
    acc.update_layout(title="Accepted draft tokens per step (share of steps; the bonus token not counted)",
                      barmode="group", xaxis_title="accepted draft tokens", yaxis_title="share of steps",
                      template="plotly_white")
    return {"speedup": speed, "acceptance": acc}


def repeat_speedups(g: "pandas.DataFrame", vanilla: "pandas.DataFrame") -> list[float]:
    """Per repeat present in both: mean tokens/s of `g`'s records over vanilla's of that repeat."""
    van = vanilla.groupby("repeat").tokens_per_s.mean()
    per = g.groupby("repeat").tokens_per_s.mean()
    return [float(per[k] / van[k]) for k in per.index if k in van.index and van[k] > 0]


def same_length_speedup(g: "pandas.DataFrame", vanilla: "pandas.DataFrame") -> float:
    """Ratio of mean tokens/s of `g`'s records over vanilla's, each question (and repeat) measured
    at the length L both outputs reach: L / (ms at which token L was there, `token_ms`). Equal to
    the Spec-Bench ratio when every output has vanilla's length; NaN where records lack `token_ms`
    (peers, older files)."""
    if "token_ms" not in g or "token_ms" not in vanilla:
        return float("nan")
    van = {(q, r): t for q, r, t in zip(vanilla.question_id, vanilla.repeat, vanilla.token_ms) if isinstance(t, list)}
    mine, theirs = [], []
    for q, r, t in zip(g.question_id, g.repeat, g.token_ms):
        v = van.get((q, r))
        n = min(len(t), len(v)) if isinstance(t, list) and v is not None else 0
        if n and t[n - 1] > 0 and v[n - 1] > 0:
            mine.append(n / t[n - 1])
            theirs.append(n / v[n - 1])
    return sum(mine) / sum(theirs) if mine else float("nan")


def _with_repeat(df: "pandas.DataFrame") -> "pandas.DataFrame":
    """Records with an integer `repeat` (absent in older files, read as 0)."""
    return df.assign(repeat=df["repeat"].fillna(0).astype(int) if "repeat" in df else 0)


def summarize(df: "pandas.DataFrame") -> "pandas.DataFrame":
    """Per-category and overall rows per method (Spec-Bench speed.py conventions). `questions`
    counts distinct questions; `repeats` the repeats seen; `speedup_std` (sample std, NaN for one
    repeat), `speedup_min`, `speedup_max` spread the per-repeat speedups (`repeat_speedups`)."""
    import pandas as pd

    df = _with_repeat(df)
    rows = []
    vanilla_speed: dict[str, float] = {}
    groups = [(c, df[df.category == c]) for c in [c for c in CATEGORIES if c in set(df.category)]]
    groups.append(("overall", df))
    for cat, part in groups:
        vanilla = part[part.method == "vanilla"]
        for method, g in part.groupby("method", sort=False):
            speed = float(g.tokens_per_s.mean())
            if method == "vanilla":
                vanilla_speed[cat] = speed
            per = repeat_speedups(g, vanilla)
            spread = {"repeats": int(g.repeat.nunique()),
                      "speedup_std": float(pd.Series(per).std(ddof=1)) if len(per) > 1 else float("nan"),
                      "speedup_min": min(per) if per else float("nan"),
                      "speedup_max": max(per) if per else float("nan")}
            rows.append({"category": cat, "method": method, "questions": int(g.question_id.nunique()),
                         "tokens_per_s": speed, "speedup_same_length": same_length_speedup(g, vanilla),
                         "mean_accepted": float(g.committed.sum() / g.steps.sum()) if g.steps.sum() else 1.0,
                         "exact_match_rate": float(g.matches_vanilla.mean()),
                         "lossless_rate": float(g.lossless.mean()),
                         "rouge_l_vs_vanilla": float(g.rouge_l_vs_vanilla.mean()),
                         "nll_ratio": float(g.nll_ratio.dropna().mean()) if g.nll_ratio.notna().any() else float("nan"),
                         "retrieval_step_share": float(g.retrieval_steps.sum() / g.steps.sum()) if g.steps.sum() else 0.0,
                         "trigger_rate": float(g.trigger_fired.sum() / g.steps.sum()) if g.steps.sum() else 0.0,
                         "relaxed_per_token": float(g.relaxed_tokens.sum() / g.new_tokens.sum()) if g.new_tokens.sum() else 0.0,
                         "trie_branching": _branching(g),
                         **anatomy_columns(g, vanilla), **spread})
    out = pd.DataFrame(rows)
    out.insert(4, "speedup_vs_vanilla", [r["tokens_per_s"] / vanilla_speed[r["category"]]
                                         if vanilla_speed.get(r["category"]) else float("nan") for r in rows])
    decode = {(cat, method): decode_tokens_per_s(g) for cat, part in groups for method, g in part.groupby("method")}
    out.insert(5, "decode_tokens_per_s", [decode[(r["category"], r["method"])] for r in rows])
    out.insert(6, "decode_speedup", [decode[(r["category"], r["method"])] / decode[(r["category"], "vanilla")]
                                     if decode.get((r["category"], "vanilla"), 0) > 0 else float("nan") for r in rows])
    return out


def decode_tokens_per_s(g: "pandas.DataFrame") -> float:
    """Mean over records of new tokens / (wall - prefill): the speed with the prompt's forward left
    out (the same for every method; tens of seconds for a long prompt on a large target), where
    an EAGLE head's catch-up on the prompt counts as decoding (respec.lab.bench's timer edges).
    NaN when no record has the engine's totals (peers, older files)."""
    if "totals" not in g:
        return float("nan")
    speeds = [n / ((t["wall_ms"] - t.get("prefill_ms", 0.0)) / 1000) for n, t in zip(g.new_tokens, g.totals)
              if isinstance(t, dict) and t.get("wall_ms", 0) > t.get("prefill_ms", 0.0)]
    return sum(speeds) / len(speeds) if speeds else float("nan")


def compare_runs(before: "pandas.DataFrame", after: "pandas.DataFrame") -> "pandas.DataFrame":
    """Two bench runs' records (e.g. `--compile off` then `on`): per category (and overall) and
    method in both, `ratio` = mean tokens/s after / before (Spec-Bench's ratio of means) and
    `ratio_same_length` (each question and repeat at the length both runs' outputs reach,
    `same_length_speedup`)."""
    import pandas as pd

    rows = []
    before, after = _with_repeat(before), _with_repeat(after)
    cats = [c for c in CATEGORIES if c in set(after.category) & set(before.category)]
    for cat in cats + ["overall"]:
        b = before if cat == "overall" else before[before.category == cat]
        a = after if cat == "overall" else after[after.category == cat]
        for method in dict.fromkeys(a.method):
            ga, gb = a[a.method == method], b[b.method == method]
            if gb.empty:
                continue
            rows.append({"category": cat, "method": method, "before_tokens_per_s": float(gb.tokens_per_s.mean()),
                         "after_tokens_per_s": float(ga.tokens_per_s.mean()),
                         "ratio": float(ga.tokens_per_s.mean() / gb.tokens_per_s.mean()),
                         "ratio_same_length": same_length_speedup(ga, gb)})
    return pd.DataFrame(rows)


#: Draft depths whose acceptance the summary reports (accept_at_depth_1 ..).
SUMMARY_DEPTHS = 4


def anatomy_columns(g: "pandas.DataFrame", vanilla: "pandas.DataFrame") -> dict[str, float]:
    """A group's acceptance by draft position (accept_at_depth_d: accepted / reached draft tokens
    at depth d; reach_depth_d: share of drafting steps whose accepted path reaches d) and its
    speedup's factors over vanilla's records of the same group (respec/anatomy.py: tokens per
    forward, a forward's cost in plain forwards, its ms split, the cost model's prediction against
    what the planned steps realised). NaN where the records predate these fields (and for peers)."""
    nan = float("nan")
    out = {f"accept_at_depth_{d}": nan for d in range(1, SUMMARY_DEPTHS + 1)}
    out.update({f"reach_depth_{d}": nan for d in range(1, SUMMARY_DEPTHS + 1)})
    out.update(dict.fromkeys(("tokens_per_forward", "step_cost", "verify_ms_per_forward", "draft_ms_per_forward",
                              "other_ms_per_forward", "loop_ms_per_step", "predicted_tokens",
                              "realised_tokens"), nan))
    if "depth" not in g or "totals" not in g:
        return out
    recs = [(d, t) for d, t in zip(g["depth"], g["totals"]) if isinstance(d, dict) and isinstance(t, dict)]
    vrecs = [t for t in vanilla.get("totals", []) if isinstance(t, dict)]
    if not recs or not vrecs:
        return out
    depth = DepthAcceptance()
    for d, _ in recs:
        depth = depth.merge(DepthAcceptance.from_dict(d))
    for d in range(1, SUMMARY_DEPTHS + 1):
        r, reach = depth.rate(d), depth.reach(d)
        out[f"accept_at_depth_{d}"] = nan if r is None else r
        out[f"reach_depth_{d}"] = nan if reach is None else reach
    a = anatomy(sum((Totals(**t) for _, t in recs), Totals()), sum((Totals(**t) for t in vrecs), Totals()))
    out.update(tokens_per_forward=a.tokens_per_forward, step_cost=a.step_cost, verify_ms_per_forward=a.verify_ms,
               draft_ms_per_forward=a.draft_ms, other_ms_per_forward=a.other_ms + a.prefill_ms,
               loop_ms_per_step=a.loop_ms_per_step,
               predicted_tokens=nan if a.predicted_tokens is None else a.predicted_tokens,
               realised_tokens=nan if a.realised_tokens is None else a.realised_tokens)
    return out


def _branching(g) -> float:
    """Among retrieval steps that chose >= 2 candidates, the share with >= 2 of them in the verified
    trie (NaN when no step chose two; records written before the column existed count as none)."""
    if "multi_chosen_steps" not in g:
        return float("nan")
    n = g.multi_chosen_steps.fillna(0).sum()
    return float(g.branching_steps.fillna(0).sum() / n) if n else float("nan")


SUMMARY_COLUMNS = {"questions": "{:.0f}", "tokens_per_s": "{:.1f}", "speedup_vs_vanilla": "{:.2f}x",
                   "decode_tokens_per_s": "{:.1f}", "decode_speedup": "{:.2f}x",
                   "speedup_same_length": "{:.2f}x",
                   "mean_accepted": "{:.2f}", "exact_match_rate": "{:.2f}", "lossless_rate": "{:.2f}",
                   "rouge_l_vs_vanilla": "{:.2f}", "nll_ratio": "{:.3f}", "retrieval_step_share": "{:.2f}",
                   "trigger_rate": "{:.2f}", "relaxed_per_token": "{:.3f}", "trie_branching": "{:.2f}",
                   **{f"accept_at_depth_{d}": "{:.2f}" for d in range(1, SUMMARY_DEPTHS + 1)},
                   "tokens_per_forward": "{:.2f}", "step_cost": "{:.2f}", "verify_ms_per_forward": "{:.1f}",
                   "draft_ms_per_forward": "{:.1f}", "other_ms_per_forward": "{:.1f}", "loop_ms_per_step": "{:.2f}",
                   "predicted_tokens": "{:.2f}", "realised_tokens": "{:.2f}"}


def _repeated(summary: "pandas.DataFrame") -> bool:
    return "repeats" in summary and bool((summary.repeats > 1).any())


def spread_text(row) -> str:
    """"±std [min–max]" of a summary row's per-repeat speedups ("" for one repeat)."""
    if row.get("repeats", 1) <= 1 or row.get("speedup_min") != row.get("speedup_min"):
        return ""
    std = row["speedup_std"]
    return (f"±{std:.2f} " if std == std else "") + f"[{row['speedup_min']:.2f}–{row['speedup_max']:.2f}]"


def speedup_matrix_markdown(summary: "pandas.DataFrame") -> str:
    """Categories x methods: speedup over vanilla with the mean accepted length in brackets (and,
    with several repeats, the per-repeat spread: ±std [min–max]); where the same-length speedup
    reads differently to two decimals, it follows as "= 0.97x at equal length", and the decode-only
    speedup (prefill left out, `decode_tokens_per_s`) as "· decode 1.40x" where it differs likewise."""
    repeated = _repeated(summary)
    methods = list(dict.fromkeys(summary.method))
    lines = ["| category | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for cat in dict.fromkeys(summary.category):
        cells = []
        for m in methods:
            r = summary[(summary.category == cat) & (summary.method == m)]
            spread = "" if r.empty or not repeated else " " + spread_text(r.iloc[0])
            same = r.iloc[0].get("speedup_same_length", float("nan")) if not r.empty else float("nan")
            at_length = (f" = {same:.2f}x at equal length"
                         if same == same and f"{same:.2f}" != f"{r.iloc[0].speedup_vs_vanilla:.2f}" else "")
            decode = r.iloc[0].get("decode_speedup", float("nan")) if not r.empty else float("nan")
            decoding = (f" · decode {decode:.2f}x"
                        if decode == decode and f"{decode:.2f}" != f"{r.iloc[0].speedup_vs_vanilla:.2f}" else "")
            cells.append("" if r.empty else f"{r.iloc[0].speedup_vs_vanilla:.2f}x{spread.rstrip()} "
                                            f"({r.iloc[0].mean_accepted:.2f}){at_length}{decoding}")
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_table_markdown(summary: "pandas.DataFrame") -> str:
    """Every summary column, one row per (category, method); with several repeats, also `repeats`
    and `speedup_spread` (±std [min–max] of the per-repeat speedups)."""
    cols = list(SUMMARY_COLUMNS)
    repeated = _repeated(summary)
    extra = ["repeats", "speedup_spread"] if repeated else []
    lines = ["| category | method | " + " | ".join(cols + extra) + " |", "|---|---|" + "---|" * len(cols + extra)]
    for _, r in summary.iterrows():
        cells = [r.category, r.method] + ["" if r[c] != r[c] else SUMMARY_COLUMNS[c].format(r[c]) for c in cols]
        if repeated:
            cells += [f"{r.repeats:.0f}", spread_text(r)]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)
