"""Traces -> plotly figures: the draft tree of a step, the entropy strip, the metrics charts.
No Gradio; every function returns a `plotly.graph_objects.Figure` (UX.md §4.4).

Tree geometry: x = depth, y = leaf order (a depth-first walk gives each leaf its own row, an inner
node sits at the mean row of its children). The bonus token is drawn as an extra child of the
last accepted node, so it gets a row of its own. Edges are one line trace with None separators.
"""
from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.views.plot_style import FONT, empty_figure  # noqa: F401 (figures.empty_figure is public)
from app.views.render import short, step_roots, token_labels, token_steps
from app.views.text import COLORS

if TYPE_CHECKING:
    from respec.trace import GenerationResult, StepTrace

SOURCE_NAMES = {"root": "root", "retrieval": "retrieval", "eagle": "EAGLE-2", "target": "target"}
#: Marker outline per verification outcome (colour = source, outline = outcome).
STATUS_STYLE = {
    "accepted": dict(symbol="circle", line=dict(color="#111111", width=3), opacity=1.0),
    "relaxed": dict(symbol="diamond", line=dict(color=COLORS["relaxed"], width=4), opacity=1.0),
    "rejected": dict(symbol="circle-x", line=dict(color=COLORS["rejected"], width=2), opacity=0.85),
    "unvisited": dict(symbol="circle", line=dict(color="#999999", width=1), opacity=0.35),
}
STATUS_NAMES = {"accepted": "accepted", "relaxed": "accepted (relaxed)", "rejected": "rejected",
                "unvisited": "not reached"}


#: Legend in one row between the title and the plot area, so it never covers an axis title.
_TOP_LEGEND = dict(orientation="h", yanchor="bottom", y=1.02, x=0, xanchor="left")


def _title(text: str) -> dict:
    return dict(text=html.escape(text), x=0.01, xanchor="left", y=0.97, yref="container", yanchor="top",
                font=dict(size=14))


# ------------------------------------------------------------------------------- draft tree
def tree_layout(parents: Sequence[int]) -> list[float]:
    """Row of each node: leaves get consecutive rows in depth-first order, inner nodes the mean
    of their children. parents[0] == -1 (the root)."""
    n = len(parents)
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        children[parents[i]].append(i)
    rows = [0.0] * n
    next_row = 0
    stack: list[tuple[int, bool]] = [(0, False)]
    while stack:                       # iterative post-order DFS (trees may be 500 deep chains)
        node, done = stack.pop()
        if done or not children[node]:
            if children[node]:
                rows[node] = sum(rows[c] for c in children[node]) / len(children[node])
            else:
                rows[node] = float(next_row)
                next_row += 1
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(children[node]))
    return rows


def _node_size(source: str, score: float | None) -> float:
    if score is None or not math.isfinite(score):
        return 16.0
    if source == "retrieval":                  # EMA score in [0, 1]
        return 10.0 + 22.0 * max(0.0, min(1.0, score))
    if source == "eagle":                      # cumulative log q -> path probability
        return 10.0 + 22.0 * math.exp(min(0.0, score))
    return 16.0


def tree_figure(step: StepTrace, decoder, title: str = "", height: int = 480) -> go.Figure:
    """The draft tree of one step: nodes coloured by source, outlined by verification outcome,
    sized by score; the accepted path drawn thick; the target's bonus token as a green node."""
    tree, v = step.tree, step.verdict
    n = tree.size
    # 1. Geometry, with the bonus token as an extra child of the last accepted node.
    parents = list(tree.parents) + [v.path[-1]]
    depths = list(tree.depths()) + [tree.depths()[v.path[-1]] + 1]
    rows = tree_layout(parents)
    ys = [-r for r in rows]
    tokens = list(tree.tokens) + [v.next_token]
    pieces = [decoder.piece(t) for t in tokens]
    on_path = {node: i for i, node in enumerate(v.path)}
    fig = go.Figure()
    # 2. Edges: all, then the accepted path (plus the edge to the bonus) on top.
    ex, ey = [], []
    for i in range(1, n):
        ex += [depths[parents[i]], depths[i], None]
        ey += [ys[parents[i]], ys[i], None]
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line=dict(color="#c8c8c8", width=1.5),
                             hoverinfo="skip", showlegend=False))
    px, py = [], []
    for node in list(v.path[1:]) + [n]:
        px += [depths[parents[node]], depths[node], None]
        py += [ys[parents[node]], ys[node], None]
    fig.add_trace(go.Scatter(x=px, y=py, mode="lines", line=dict(color="#111111", width=4),
                             hoverinfo="skip", name="accepted path"))
    # 3. Nodes, one trace per outcome (legend = outcome), colour per node = source.
    show_text = n <= 48
    for status, style in STATUS_STYLE.items():
        idx = [i for i in range(n) if v.node_status[i] == status]
        if not idx:
            continue
        colors = [COLORS["root"] if tree.sources[i] == "root" else COLORS[tree.sources[i]] for i in idx]
        sizes = [_node_size(tree.sources[i], tree.scores[i] if tree.scores is not None else None) for i in idx]
        hover = [_node_hover(step, i, pieces[i], depths[i], on_path) for i in idx]
        fig.add_trace(go.Scatter(
            x=[depths[i] for i in idx], y=[ys[i] for i in idx], mode="markers+text" if show_text else "markers",
            text=[short(pieces[i]) for i in idx], textposition="middle right", textfont=dict(size=11),
            marker=dict(color=colors, size=sizes, symbol=style["symbol"], line=style["line"],
                        opacity=style["opacity"]),
            hovertext=hover, hoverinfo="text", name=STATUS_NAMES[status]))
    # 4. The bonus / recovered token.
    fig.add_trace(go.Scatter(
        x=[depths[n]], y=[ys[n]], mode="markers+text", text=[short(pieces[n])], textposition="middle right",
        marker=dict(color=COLORS["target"], size=18, symbol="star", line=dict(color="#111111", width=1)),
        hovertext=[f"<b>{html.escape(repr(pieces[n]))}</b> (id {tokens[n]})<br>target's {v.next_kind} token"
                   f"<br>becomes the next step's root"],
        hoverinfo="text", name=f"target {v.next_kind}"))
    # 5. Source colour key (legend only).
    for src in ("retrieval", "eagle"):
        if src in tree.sources:
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"drafted by {SOURCE_NAMES[src]}",
                                     marker=dict(color=COLORS[src], size=12)))
    max_depth = max(depths)
    fig.update_layout(
        title=_title(title), height=height, font=FONT, template="plotly_white",
        margin=dict(l=10, r=10, t=84, b=40), hoverlabel=dict(align="left"),
        xaxis=dict(title="depth (position after the committed text)", dtick=1,
                   range=[-0.4, max_depth + 1.2], zeroline=False),
        yaxis=dict(visible=False), legend=_TOP_LEGEND,
        uirevision=f"tree-{id(decoder)}")
    return fig


def _node_hover(step: StepTrace, i: int, piece: str, depth: int, on_path: dict[int, int]) -> str:
    tree, v = step.tree, step.verdict
    lines = [f"<b>{html.escape(repr(piece))}</b> (id {tree.tokens[i]}) · node {i} · depth {depth}",
             f"drafted by {SOURCE_NAMES.get(tree.sources[i], tree.sources[i])} · {STATUS_NAMES[v.node_status[i]]}"]
    if tree.scores is not None:
        s = tree.scores[i]
        if tree.sources[i] == "retrieval":
            lines.append(f"EMA score S = {s:.3f}")
        elif tree.sources[i] == "eagle":
            lines.append(f"cumulative log q = {s:.3f} (path prob {math.exp(min(0.0, s)):.3f})")
    if tree.draft_probs is not None and i > 0:
        lines.append(f"draft prob q = {tree.draft_probs[i]:.3f}")
    if i > 0 and len(step.node_ranks) == tree.size:
        lines.append(f"target: rank {step.node_ranks[i]}, p = {step.node_probs[i]:.3f} after its parent")
    if i in on_path and on_path[i] < len(step.entropies):
        k = on_path[i]
        lines.append(f"target after it: entropy {step.entropies[k]:.3f} nats, top-1 margin {step.margins[k]:.2f}")
    return "<br>".join(lines)


# ------------------------------------------------------------------------------- entropy strip
def entropy_figure(result: GenerationResult, decoder, theta: float | None = None, selected: int | None = None,
                   label: str = "", height: int = 330) -> go.Figure:
    """Target entropy per generated token, coloured by who produced the token; θ_H as a dashed
    line; ▲ where a step drafted by retrieval (green: ≥ 1 accepted, red: none), ▽ where the entropy
    trigger fired but no candidate qualified; the selected step shaded. customdata = step index
    (the page selects that step when a point is clicked)."""
    ent = result.token_entropies()
    if not ent:
        return empty_figure("no tokens")
    pieces = decoder.pieces(result.tokens)
    labels = token_labels(result)
    owner = token_steps(result)
    theta = result.config.trigger.theta_entropy if theta is None else theta
    fig = go.Figure()
    x = list(range(len(ent)))
    fig.add_trace(go.Scatter(x=x, y=ent, mode="lines", line=dict(color="#bbbbbb", width=1), hoverinfo="skip",
                             showlegend=False))
    for lab in ("target", "eagle", "retrieval", "relaxed"):
        idx = [i for i in x if labels[i] == lab]
        if not idx:
            continue
        fig.add_trace(go.Scatter(
            x=idx, y=[ent[i] for i in idx], mode="markers", name=SOURCE_NAMES.get(lab, lab),
            marker=dict(color=COLORS[lab], size=7), customdata=[owner[i] for i in idx],
            hovertext=[f"#{i} {html.escape(repr(pieces[i]))}<br>entropy {ent[i]:.3f} nats<br>step {owner[i]}"
                       for i in idx], hoverinfo="text"))
    roots = step_roots(result)
    hx, hy, ht, hc, fx, fy, ft, fc = [], [], [], [], [], [], [], []
    for s, r in zip(result.steps, roots):
        if r >= len(ent):
            continue
        if s.source == "retrieval":
            hx.append(r); hy.append(ent[r]); hc.append(COLORS["target"] if s.num_accepted else COLORS["rejected"])
            ht.append(f"step {s.step}: retrieval, {s.num_accepted}/{s.num_draft} accepted")
        elif s.decision is not None and s.decision.fired:
            fx.append(r); fy.append(ent[r]); fc.append("#777777")
            ft.append(f"step {s.step}: trigger fired, no candidate → {s.source}")
    if hx:
        fig.add_trace(go.Scatter(x=hx, y=hy, mode="markers", name="retrieval step (green helped, red failed)",
                                 marker=dict(symbol="triangle-up", size=14, color=hc, line=dict(color="#111", width=1)),
                                 customdata=[owner[min(h + 1, len(owner) - 1)] for h in hx], hovertext=ht,
                                 hoverinfo="text"))
    if fx:
        fig.add_trace(go.Scatter(x=fx, y=fy, mode="markers", name="trigger fired, fell back",
                                 marker=dict(symbol="triangle-down-open", size=12, color=fc),
                                 customdata=[owner[min(h + 1, len(owner) - 1)] for h in fx], hovertext=ft,
                                 hoverinfo="text"))
    fig.add_hline(y=theta, line=dict(color=COLORS["retrieval"], dash="dash", width=1.5),
                  annotation_text=f"θ_H = {theta:.2f}", annotation_position="top left")
    if selected is not None and 0 <= selected < len(result.steps):
        r = roots[selected]
        fig.add_vrect(x0=r - 0.5, x1=r + len(result.steps[selected].new_tokens) + 0.5,
                      fillcolor="#0072B2", opacity=0.12, line_width=0)
    fig.update_layout(
        title=_title(f"{label} · target entropy per generated token" if label else "target entropy per generated token"),
        height=height, font=FONT, template="plotly_white", margin=dict(l=40, r=10, t=84, b=40),
        xaxis=dict(title="generated token", zeroline=False), yaxis=dict(title="nats", rangemode="tozero"),
        legend=_TOP_LEGEND, hovermode="closest", clickmode="event",
        uirevision=f"entropy-{label}")
    return fig


# ------------------------------------------------------------------------------- metrics charts
def metrics_figure(runs: Sequence[tuple[str, GenerationResult]], height: int = 300) -> go.Figure:
    """Left: acceptance-length histogram per run (accepted draft tokens per step, bonus excluded).
    Right: mean draft and verify time per step."""
    if not runs:
        return empty_figure("no runs yet", height)
    palette = [COLORS["retrieval"], COLORS["eagle"], "#777777", COLORS["relaxed"]]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.12,
                        subplot_titles=("steps by accepted draft tokens (bonus excluded)", "ms per step"))
    for k, (label, r) in enumerate(runs):
        hist = list(r.stats.accept_length_hist)
        fig.add_trace(go.Bar(x=list(range(len(hist))), y=hist, name=label, marker_color=palette[k % len(palette)],
                             legendgroup=label), row=1, col=1)
    # Right: stacked horizontal bars (plotly has one barmode per figure, so the verify bars are
    # stacked by hand: same offsetgroup, base = the draft bar).
    labels = [label for label, _ in runs]
    draft = [r.stats.draft_ms / max(1, r.stats.steps) for _, r in runs]
    verify = [r.stats.verify_ms / max(1, r.stats.steps) for _, r in runs]
    fig.add_trace(go.Bar(y=labels, x=draft, orientation="h", name="draft", marker_color="#56B4E9",
                         offsetgroup="t"), row=1, col=2)
    fig.add_trace(go.Bar(y=labels, x=verify, base=draft, orientation="h", name="verify", marker_color="#999999",
                         offsetgroup="t"), row=1, col=2)
    fig.update_layout(barmode="group", height=height, font=FONT, template="plotly_white",
                      margin=dict(l=10, r=10, t=48, b=36), legend=dict(orientation="h", y=-0.2, x=0))
    fig.update_xaxes(title_text="accepted draft tokens", dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="ms", row=1, col=2)
    return fig
