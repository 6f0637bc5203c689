"""The page's components, tab by tab (ARCHITECTURE.md §6.8); app/page/ui.py wires their events.

Contract: call the builders inside a `gr.Blocks` context, in page order: `header`, then inside
`gr.Tabs` `compare_tab`, `explorer_tab`, `traces_tab`, `lab_tab`, `about_tab`. Each adds its
components to one `Page`: `outputs` are what handlers update, keyed by the names their dicts use
(their insertion order is the page's output list); `inputs` are the controls and buttons events
read or listen to; `controls` are the settings sliders keyed by `SPECS` key. Nothing here loads a
model or registers an event. Stable element ids (tests rely on them): prompt, run, stop,
respec-output, eagle-output, metrics, entropy-plot, tree-plot, step-slider, trace-upload,
trace-download, repeats, the settings' `set-*` ids, the Lab's `lab-*` ids (and the run history's,
listed in app/events/tuning.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from app.events import tuning
from app.events.lab import DEFAULT_BUDGET, default_questions_path, lab_budget
from app.events.updates import column_header
from app.session import traces
from app.session.hub import ModelHub, choice_label
from app.session.settings import COLUMN_A_METHODS, PRESET_HELP, PRESETS, SECTIONS, SPECS, Caps, method_label
from app.views.render import colors
from app.views.text import ABOUT_MD, API_MD, DIFF_COLORS, EMPTY_HINT, INTRO, LEGEND_MD, STEP_HELP, TUNING_MD
from respec.config import METHODS
from respec.lab.bench import CATEGORIES, PEERS


@dataclass
class Page:
    """Every component the events need, by name."""
    outputs: dict[str, Any] = field(default_factory=dict)     # handler output name -> component
    inputs: dict[str, Any] = field(default_factory=dict)      # controls and buttons events read / listen to
    controls: dict[str, Any] = field(default_factory=dict)    # SPECS key -> settings control
    history: dict[str, Any] = field(default_factory=dict)     # the run history panel (tuning.build_history_panel)
    lab: dict[str, Any] = field(default_factory=dict)         # the Lab tab (not part of `outputs`)
    recorded: list[tuple[str, str]] = field(default_factory=list)   # shipped traces: (label, name)


# ------------------------------------------------------------------------------- above the tabs
def header(page: Page) -> None:
    """Intro, the replay-mode banner, the status line and teaching mode."""
    gr.Markdown(INTRO)
    page.outputs["banner"] = gr.Markdown("", visible=False, elem_id="model-banner")
    with gr.Row(equal_height=True):
        page.outputs["status"] = gr.Markdown(EMPTY_HINT, elem_id="status")
        page.inputs["teaching"] = gr.Checkbox(False, label="teaching mode (narrate each step)", elem_id="teaching",
                                              scale=0, min_width=280)


# ------------------------------------------------------------------------------- Compare
def compare_tab(page: Page, hub: ModelHub, caps: Caps, start: dict[str, Any]) -> None:
    """Prompt, Run / Stop, model, options, examples, settings, the output columns, the comparison
    and the run history. `start` is every control's starting value (the device defaults)."""
    out, inp = page.outputs, page.inputs
    with gr.Row(equal_height=False):
        with gr.Column(scale=5):
            out["prompt"] = gr.Textbox(label="Prompt", lines=3, max_lines=12, elem_id="prompt",
                                       placeholder="Ask something; text that repeats itself shows retrieval at work. "
                                                   "A chat is a JSON list: [{\"role\": \"user\", \"content\": \"…\"}, …]")
        with gr.Column(scale=1, min_width=160):
            inp["run"] = gr.Button("▶ Run", variant="primary", elem_id="run")
            inp["stop"] = gr.Button("■ Stop", variant="stop", elem_id="stop")
            inp["model"] = gr.Dropdown([(choice_label(c), c) for c in hub.choices], value=hub.spec,
                                       label="model", elem_id="model", interactive=len(hub.choices) > 1,
                                       info="models this machine can hold, each with its EAGLE head")
    with gr.Row():
        inp["include_vanilla"] = gr.Checkbox(False, label="also run vanilla (measured speedup)",
                                             elem_id="include-vanilla")
        inp["show_rejected"] = gr.Checkbox(False, label="show rejected drafts", elem_id="show-rejected")
        inp["column_a"] = gr.Dropdown([(method_label(m), m) for m in COLUMN_A_METHODS], value="respec",
                                      label="left column runs", elem_id="column-a",
                                      info="against EAGLE-2 on the right")
        inp["repeats"] = gr.Slider(1, tuning.MAX_REPEATS, value=1, step=1, elem_id="repeats",
                                   label="repeat ×N (same settings; median and spread of tokens/s)")
    examples = traces.example_prompts()
    if examples:
        gr.Examples([[p] for p in examples], inputs=[out["prompt"]], label="Example prompts")
    with gr.Accordion("Settings — every threshold", open=False, elem_id="settings"):
        settings_panel(page, caps, start)
    output_columns(page)
    gr.Markdown(LEGEND_MD)
    out["live_narration"] = gr.Markdown("", elem_id="live-narration")
    out["badge"] = gr.HTML("", elem_id="identical-badge")
    out["diff"] = gr.HighlightedText([], label="token diff (A = left column, B = right column)",
                                     color_map=DIFF_COLORS, show_legend=True, visible=False, elem_id="token-diff")
    out["metrics"] = gr.HTML("", elem_id="metrics")
    out["metrics_plot"] = gr.Plot(label="acceptance and timing", show_label=False, elem_id="metrics-plot")
    out["anatomy_plot"] = gr.Plot(label="why a draft pays or not", show_label=False, elem_id="anatomy-plot")
    page.history = tuning.build_history_panel()      # run history, baseline A (not in the outputs)


def settings_panel(page: Page, caps: Caps, start: dict[str, Any]) -> None:
    """The preset, one group of controls per section of SPECS (EAGLE-2's with the auto switch),
    and the settings JSON an API call would need."""
    with gr.Row():
        page.inputs["preset"] = gr.Radio(list(PRESETS), value="device defaults", label="preset",
                                         info=" · ".join(f"{k}: {v}" for k, v in PRESET_HELP.items()),
                                         elem_id="preset")
    for section in SECTIONS:
        with gr.Group():
            gr.Markdown(f"**{section}**")
            with gr.Row():
                if section == "EAGLE-2 tree":
                    page.inputs["auto"] = gr.Checkbox(bool(start["tree.auto"]), label="auto (prune each tree to what pays)",
                                                      info="keeps only as many nodes as maximise expected tokens/s "
                                                           "(measured verify cost × head confidence); total tokens "
                                                           "is then the maximum",
                                                      elem_id="tree-auto")
                for spec in (s for s in SPECS if s.section == section):
                    page.controls[spec.key] = _control(spec, caps, start[spec.key])
    page.inputs["settings_json"] = gr.Code("{}", language="json", label="settings_json for the API (non-default values)",
                                           interactive=False, elem_id="settings-json")


def _control(spec, caps: Caps, value: Any):
    """One setting's control: a number box for the seed, a slider for everything else."""
    if spec.key == "sampling.seed":
        return gr.Number(value, label=spec.label, info=spec.help, precision=0, minimum=0, elem_id=control_id(spec.key))
    maximum = min(spec.maximum, caps.max_new_tokens) if spec.key == "max_new_tokens" else spec.maximum
    return gr.Slider(spec.minimum, maximum, value=value, step=spec.step, label=spec.label, info=spec.help,
                     elem_id=control_id(spec.key), min_width=200)


def control_id(key: str) -> str:
    """A setting's element id: "set-" + its dotted key with dashes ("set-tree-total-tokens")."""
    return "set-" + key.replace(".", "-").replace("_", "-")


def output_columns(page: Page) -> None:
    """One column per method (vanilla hidden until it runs): header, token strip, live line, download."""
    out = page.outputs
    with gr.Row(equal_height=False):
        for key, elem in (("respec", "respec-output"), ("eagle", "eagle-output"), ("vanilla", "vanilla-output")):
            with gr.Column(visible=key != "vanilla", min_width=320) as col:
                out[f"{key}_header"] = gr.Markdown(column_header(key), elem_id=f"{key}-header")
                out[f"{key}_out"] = gr.HighlightedText(
                    [], label="output (colour = who drafted each token)", color_map=colors(),
                    show_legend=True, combine_adjacent=False, elem_id=elem, show_label=False,
                    elem_classes=["token-strip"])
                out[f"{key}_live"] = gr.Markdown("", elem_classes=["live-line"])
                out[f"{key}_download"] = gr.DownloadButton("⬇ trace", visible=False, size="sm",
                                                           elem_id=f"{key}-download")
            if key == "vanilla":
                out["vanilla_col"] = col


# ------------------------------------------------------------------------------- Step explorer
def explorer_tab(page: Page) -> None:
    """Run picker, step slider, step buttons and Play, then every view of the chosen step."""
    out, inp = page.outputs, page.inputs
    gr.Markdown(STEP_HELP)
    with gr.Row(equal_height=False):
        out["run_picker"] = gr.Radio([], label="run", elem_id="run-picker", scale=1)
        out["step_slider"] = gr.Slider(0, 1, value=0, step=1, label="step (one target forward)",
                                       elem_id="step-slider", scale=3, interactive=False)
    with gr.Row():
        inp["prev"] = gr.Button("◀ prev", size="sm", elem_id="prev-step")
        inp["next"] = gr.Button("next ▶", size="sm", elem_id="next-step")
        out["play"] = gr.Button("▶ play", size="sm", elem_id="play")
        inp["rejection"] = gr.Button("next full rejection", size="sm", elem_id="next-rejection")
        inp["retrieval"] = gr.Button("next retrieval", size="sm", elem_id="next-retrieval")
        inp["relaxed"] = gr.Button("next relaxed", size="sm", elem_id="next-relaxed")
        inp["trigger"] = gr.Button("next trigger", size="sm", elem_id="next-trigger")
    out["timer"] = gr.Timer(0.8, active=False)
    out["step_info"] = gr.Markdown("", elem_id="step-info")
    out["narration"] = gr.Markdown("", elem_id="narration")
    out["entropy_plot"] = gr.Plot(label="entropy", show_label=False, elem_id="entropy-plot")
    out["entropy_click"] = gr.Number(-1, visible="hidden", elem_id="entropy-click", precision=0)
    out["step_strip"] = gr.HighlightedText([], label="this step's tokens in the output", color_map=colors(),
                                           show_legend=False, show_inline_category=False,
                                           elem_id="step-strip", elem_classes=["token-strip"])
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            out["tree_plot"] = gr.Plot(label="draft tree", show_label=False, elem_id="tree-plot")
        with gr.Column(scale=2):
            out["decision"] = gr.Markdown("", elem_id="decision")
    out["cand_table"] = gr.Dataframe(label="retrieval candidates (ReSpec: position, match length, "
                                           "EMA score before/after, drafted and accepted tokens)",
                                     interactive=False, elem_id="candidates", max_height=260, wrap=True)
    out["node_table"] = gr.Dataframe(label="verification outcome per node", interactive=False,
                                     elem_id="nodes", max_height=360, wrap=True)


# ------------------------------------------------------------------------------- Trace files
def traces_tab(page: Page) -> None:
    """Open a shipped trace, upload trace files, download the selected run's trace and its header."""
    out, inp = page.outputs, page.inputs
    gr.Markdown("Replay runs without a model: open a recorded trace, or upload trace files "
                "(the JSON the *download* buttons and `python -m respec generate --trace` write). "
                "One file per column; a ReSpec/SAM trace goes left, an EAGLE-2 trace right.")
    page.recorded = traces.recorded_choices()
    with gr.Row():
        inp["trace_picker"] = gr.Dropdown(page.recorded, value=page.recorded[0][1] if page.recorded else None,
                                          label="recorded traces", elem_id="trace-picker", scale=3)
        inp["open"] = gr.Button("Open", elem_id="open-trace", scale=1)
    inp["upload"] = gr.File(label="upload trace file(s)", file_count="multiple", file_types=[".json"],
                            elem_id="trace-upload")
    out["trace_download"] = gr.DownloadButton("Download trace (JSON)", elem_id="trace-download", interactive=False)
    out["trace_header"] = gr.JSON({}, label="trace header (settings, seed, model, stats)", open=False,
                                  elem_id="trace-header")


# ------------------------------------------------------------------------------- Lab
def lab_tab(page: Page, caps: Caps) -> None:
    """The Lab's components: selection, methods or a 2-D grid, run/stop, status, live table and
    chart, CSV export."""

    c = page.lab
    found = default_questions_path()
    gr.Markdown("Run Spec-Bench questions with several methods, or one method over a grid of two settings, "
                "on the loaded model. Results stream in as each question finishes. "
                + (f"Questions: the dev split at `{found}` unless you upload another file." if found else
                   "Upload a Spec-Bench question file (JSONL with `question_id`, `category`, `turns`).")
                + f" Runs are bounded: turns × runs × tokens ≤ {lab_budget():,} (RESPEC_LAB_BUDGET, "
                f"default {DEFAULT_BUDGET:,}). The settings of the Compare tab apply.")
    with gr.Row():
        c["mode"] = gr.Radio(["methods", "2-D grid"], value="methods", label="run", elem_id="lab-mode", scale=1)
        c["categories"] = gr.CheckboxGroup(list(CATEGORIES), value=["qa", "summarization"], label="categories",
                                           elem_id="lab-categories", scale=3)
    with gr.Row():
        c["per_category"] = gr.Slider(1, 20, value=1, step=1, label="questions per category", elem_id="lab-per-cat")
        c["max_new_tokens"] = gr.Slider(4, caps.max_new_tokens, value=min(32, caps.max_new_tokens), step=1,
                                        label="max new tokens", elem_id="lab-max-new")
    with gr.Group(visible=True) as c["methods_box"]:
        c["methods"] = gr.CheckboxGroup(list(METHODS) + list(PEERS), value=["vanilla", "eagle2", "sam", "respec"],
                                        label="methods (hf-greedy / hf-pld: transformers' own greedy and "
                                              "prompt-lookup decoding)", elem_id="lab-methods")
    with gr.Group(visible=False) as c["grid_box"]:
        with gr.Row():
            c["grid_method"] = gr.Dropdown([m for m in METHODS if m != "vanilla"], value="respec", label="method",
                                           elem_id="lab-grid-method", scale=1)
            c["grid"] = gr.Textbox("theta_H=1,2,3;L_min=2,3", label="grid: key=v1,v2;key2=v1,v2 (two keys at most)",
                                   elem_id="lab-grid", scale=3)
    c["upload"] = gr.File(label="questions JSONL (optional)", file_types=[".jsonl"], elem_id="lab-upload")
    with gr.Row():
        c["run"] = gr.Button("▶ Run Lab", variant="primary", elem_id="lab-run")
        c["stop"] = gr.Button("■ Stop", elem_id="lab-stop")
    c["status"] = gr.Markdown("", elem_id="lab-status")
    c["table"] = gr.Dataframe(label="results so far", interactive=False, elem_id="lab-table", wrap=True)
    c["plot"] = gr.Plot(label="chart", elem_id="lab-plot")
    c["download"] = gr.DownloadButton("Download CSV", visible=False, elem_id="lab-download")


# ------------------------------------------------------------------------------- About
def about_tab() -> None:
    gr.Markdown(ABOUT_MD)
    gr.Markdown(TUNING_MD)
    gr.Markdown(API_MD)
