"""The plots' shared style: the font and the empty figure that stands in for a plot with nothing to
draw. No Gradio. Contract: `empty_figure(message, height)` -> a plotly Figure with `message` centred
and no axes; `FONT` is every figure's font (app/views/figures.py, app/views/anatomy_view.py)."""
from __future__ import annotations

import plotly.graph_objects as go

FONT = dict(family="Inter, system-ui, sans-serif", size=12)


def empty_figure(message: str, height: int = 320) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                       font=dict(size=14, color="#777"))
    fig.update_layout(height=height, xaxis=dict(visible=False), yaxis=dict(visible=False),
                      margin=dict(l=10, r=10, t=40, b=10), font=FONT, template="plotly_white")
    return fig
