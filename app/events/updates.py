"""Session -> page: the dicts of component updates every event returns, built from a `SessionState`.

Contract: each function returns a dict keyed by the page's output names (the keys of `comps` in
app/page/ui.py; `ui._bind` maps them to components), built only from the state (and the model hub for
the banner), so an event handler is "change the state, then return the views". `full_update` is
every view at once (after a run or a replay); the others are the parts that one control changes:
the output strips (`outputs_update`), the comparison (`comparison_update`), the step explorer
(`explorer_update`, `step_views`) and the trace downloads (`downloads_update`, which writes each
run's trace file into the session folder). Gradio is imported inside the functions that build
component updates, so importing this module does no work.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.session import traces
from app.session.settings import COLUMN_METHODS, method_label
from app.session.state import RUN_KEYS, SessionState
from app.views import anatomy_view, figures, render
from app.views.text import EMPTY_HINT

if TYPE_CHECKING:
    from app.session.hub import ModelHub


def column_header(key: str, state: SessionState | None = None) -> str:
    """A column's title: the method that ran there (or will run), and the trace file it came from."""
    run = state.runs.get(key) if state is not None else None
    title = method_label(run.method if run is not None else COLUMN_METHODS[key])
    origin = f" <small>(replayed from {run.origin})</small>" if run is not None and run.origin != "live" else ""
    return f"### {title}{origin}"


def outputs_update(state: SessionState, show_rejected: bool) -> dict[str, Any]:
    """The three output strips, their headers and live lines, from the state."""
    out: dict[str, Any] = {}
    for key in RUN_KEYS:
        run = state.runs.get(key)
        out[f"{key}_header"] = column_header(key, state)
        out[f"{key}_out"] = render.output_spans(run.result, run.decoder, show_rejected) if run else []
        out[f"{key}_live"] = render.live_line(run.result) if run else ""
    return out


def comparison_update(state: SessionState) -> dict[str, Any]:
    """Badge, diff, metrics table and charts for the runs in the state."""
    runs = [(state.runs[k].label, state.runs[k].result) for k in RUN_KEYS if k in state.runs]
    vanilla = state.runs["vanilla"].result if "vanilla" in state.runs else None
    a, b = state.runs.get("respec"), state.runs.get("eagle")
    out: dict[str, Any] = {}
    if a is not None and b is not None:
        same, first, spans = render.aligned_diff(a.result.tokens, b.result.tokens, a.decoder, b.decoder)
        note = ""
        if vanilla is not None:
            eq = [r.label for r in (a, b) if r.result.tokens == vanilla.tokens]
            note = ("; equal to vanilla: " + (", ".join(eq) if eq else "neither"))
        out["badge"] = render.badge_html(same, first, a.label, b.label, len(a.result.tokens), len(b.result.tokens), note)
        out["diff"] = shown([] if same else spans, not same)
    else:
        out["badge"] = "<div class='respec-badge'>Run both methods (or open a pair of traces) to compare outputs.</div>"
        out["diff"] = shown([], False)
    note = "Speedups marked ≈ are estimates: tick “also run vanilla” to measure them." if vanilla is None and runs else ""
    regime = anatomy_view.regime_sentence(runs)
    note = f"{regime} {note}".strip()
    metrics = [render.run_metrics(r, vanilla) for _, r in runs]       # once per run: the table and the chart
    out["metrics"] = render.metrics_html(runs, vanilla, note, metrics)
    out["metrics_plot"] = figures.metrics_figure(runs)
    out["anatomy_plot"] = anatomy_view.anatomy_figure(runs, vanilla, metrics=metrics)
    return out


def shown(value, visible: bool):
    """A component update that sets its value and whether it is shown."""
    import gradio as gr
    return gr.update(value=value, visible=visible)


def explorer_update(state: SessionState, teaching: bool, step: int | None = None) -> dict[str, Any]:
    """Run picker, slider and every step view for the selected run and step."""
    import gradio as gr
    run = state.current()
    if run is None or not run.result.steps:
        msg = EMPTY_HINT if run is None else "This run has no steps (it stopped after the first token)."
        return {"run_picker": gr.update(choices=state.choices(), value=state.selected if run else None),
                "step_slider": gr.update(minimum=0, maximum=1, value=0, interactive=False),
                "step_info": msg, "narration": "", "tree_plot": figures.empty_figure("no step to show", 440),
                "entropy_plot": (figures.entropy_figure(run.result, run.decoder, label=run.label) if run and run.result.tokens
                                 else figures.empty_figure("no tokens to show", 300)),
                "decision": "", "cand_table": dataframe(["candidates"], []), "node_table": dataframe(["node"], []),
                "step_strip": []}
    n = len(run.result.steps)
    state.step = max(0, min(n - 1, state.step if step is None else int(step)))
    out = {"run_picker": gr.update(choices=state.choices(), value=state.selected),
           "step_slider": gr.update(minimum=0, maximum=max(1, n - 1), value=state.step, step=1, interactive=n > 1)}
    out.update(step_views(state, teaching))
    return out


def step_views(state: SessionState, teaching: bool) -> dict[str, Any]:
    """Everything that depends on the chosen step (the slider itself excluded)."""
    run = state.current()
    if run is None or not run.result.steps:
        return {}
    res, dec, i = run.result, run.decoder, state.step
    step = res.steps[i]
    cand_h, cand_r = render.candidate_rows(step, dec)
    node_h, node_r = render.node_rows(step, dec)
    title = (f"{run.label} · step {i}: {step.source} drafted {step.num_draft}, accepted {step.num_accepted}"
             + (f" ({step.verdict.num_relaxed} relaxed)" if step.verdict.num_relaxed else ""))
    return {"step_info": render.step_summary(res, i, dec) + "  \n" + anatomy_view.run_depth_line(res),
            "narration": render.narrate(res, i, dec) if teaching else "",
            "tree_plot": figures.tree_figure(step, dec, title),
            "entropy_plot": figures.entropy_figure(res, dec, selected=i, label=run.label),
            "decision": render.decision_md(step),
            "cand_table": dataframe(cand_h, cand_r),
            "node_table": dataframe(node_h, node_r),
            "step_strip": render.step_spans(res, i, dec)}


def dataframe(headers: list[str], rows: list[list[Any]]):
    """(headers, rows) as the pandas table a Dataframe component shows."""
    import pandas as pd
    return pd.DataFrame(rows, columns=headers)


def downloads_update(state: SessionState) -> dict[str, Any]:
    """Write each run's trace file into the session folder and point the download buttons at them."""
    import gradio as gr
    out: dict[str, Any] = {}
    for key in RUN_KEYS:
        run = state.runs.get(key)
        out[f"{key}_download"] = gr.update(value=traces.trace_file(state, key) if run else None, interactive=run is not None,
                                           visible=run is not None)
    run = state.current()
    out["trace_download"] = gr.update(value=traces.trace_file(state, state.selected) if run else None,
                                      interactive=run is not None,
                                      label=f"Download the {run.label} trace (JSON)" if run else "Download trace (JSON)")
    out["trace_header"] = render.trace_header(run.result) if run else {}
    return out


def full_update(state: SessionState, show_rejected: bool, teaching: bool) -> dict[str, Any]:
    """Every view of the page from the state (and the state itself): after a run or a replay."""
    import gradio as gr
    out = outputs_update(state, show_rejected)
    out["vanilla_col"] = gr.update(visible="vanilla" in state.runs)
    out.update(comparison_update(state))
    out.update(explorer_update(state, teaching))
    out.update(downloads_update(state))
    out["state"] = state
    return out


def warn(message: str, status_prefix: str = "⚠") -> dict[str, Any]:
    """A warning toast, and the same message in the status line."""
    import gradio as gr
    gr.Warning(message)
    return {"status": f"{status_prefix} {message}"}


def banner_update(hub: ModelHub) -> dict[str, Any]:
    """Show the replay-mode banner while the model cannot be loaded, hide it otherwise."""
    text = hub.banner()
    return {"banner": shown(text, bool(text))}


def vanilla_column(include: bool) -> dict[str, Any]:
    """Show the vanilla column iff vanilla runs."""
    import gradio as gr
    return {"vanilla_col": gr.update(visible=include)}
