"""The page: layout and event wiring only (ARCHITECTURE.md §6.8).

Contract: `build_demo(hub=None, caps=None)` returns a `gr.Blocks` without loading anything (the
model loads on the first run, the shipped trace opens when a page loads). Handlers return dicts
keyed by the names in `comps`; `_bind` maps them to components. Every engine run (page and API)
shares the queue's concurrency group "gpu" with limit 1, so runs never overlap and timings stay
fair. Stable element ids (tests rely on them): prompt, run, stop, respec-output, eagle-output,
metrics, entropy-plot, tree-plot, step-slider, trace-upload, trace-download, repeats (and the run
history's ids, listed in app/tuning.py).

Launch with `demo.queue(...)` already applied here and `demo.launch(**launch_kwargs())`.
"""
from __future__ import annotations

import functools
import inspect
import os
import shutil
from typing import Any, Callable

import gradio as gr

from app import handlers, tuning
from app.gpu import ZERO_GPU, gpu
from app.handlers import ModelHub
from app.lab import lab_request, lab_stream
from app.render import colors
from app.settings import PRESET_HELP, PRESETS, SECTIONS, SPECS, Caps, _env_int, non_default, preset_values
from app.state import SessionState
from app.text import (ABOUT_MD, API_MD, DIFF_COLORS, EMPTY_HINT, INTRO, LEGEND_MD, STEP_HELP, STOPPED, TITLE,
                      TUNING_MD)
from respec.errors import RespecError

#: Seconds of GPU a ZeroGPU Space reserves per run (RESPEC_GPU_DURATION; spaces.GPU's default is 60).
GPU_DURATION_S = int(os.environ.get("RESPEC_GPU_DURATION", "120") or 120)

CSS = """
.respec-metrics table { border-collapse: collapse; width: 100%; font-size: 0.92em; }
.respec-metrics th, .respec-metrics td { padding: 4px 10px; border-bottom: 1px solid var(--border-color-primary); text-align: left; }
.respec-metrics tbody th { font-weight: 500; white-space: nowrap; }
.respec-metrics .tip { opacity: 0.5; cursor: help; font-size: 0.85em; }
.respec-metrics .note { opacity: 0.75; font-size: 0.85em; padding-top: 4px; }
.respec-badge { padding: 8px 12px; border-radius: 8px; font-weight: 600; background: var(--background-fill-secondary); }
.respec-badge.same { border-left: 6px solid #009E73; }
.respec-badge.differ { border-left: 6px solid #D55E00; }
.respec-badge .vanilla { font-weight: 400; opacity: 0.8; }
#status { min-height: 1.6em; }
#model-banner { border-left: 4px solid #d97706; background: #fffbeb; color: #78350f; padding: .4em .9em; border-radius: 4px; }
.live-line { font-size: 0.85em; opacity: 0.8; min-height: 1.2em; }
.dark .gradio-container .respec-badge { color: var(--body-text-color); }
.token-strip .textfield { word-break: normal !important; line-height: 1.9 !important; }
.token-strip .token.highlighted { margin-left: 0 !important; margin-right: 1px !important; padding: 1px 1px !important; }
"""

#: Page script: (1) clicking a point of the entropy plot selects its step (plotly_click -> hidden
#: number -> change event); (2) a plot updated while its tab was hidden is sized wrongly by plotly,
#: so plots are resized when a tab is shown.
CLICK_JS = """
() => {
  document.addEventListener('click', (ev) => {
    if (!ev.target.closest || !ev.target.closest('[role="tab"]')) return;
    setTimeout(() => {
      if (!window.Plotly) return;
      document.querySelectorAll('.js-plotly-plot').forEach((gd) => {
        if (gd.offsetParent !== null) window.Plotly.Plots.resize(gd);
      });
    }, 200);
  }, true);
  const hook = () => {
    const gd = document.querySelector('#entropy-plot .js-plotly-plot');
    if (!gd || gd.__respecHooked || typeof gd.on !== 'function') return;
    gd.__respecHooked = true;
    gd.on('plotly_click', (ev) => {
      const p = ev && ev.points && ev.points[0];
      if (!p || p.customdata === undefined || p.customdata === null) return;
      const box = document.querySelector('#entropy-click input');
      if (!box) return;
      box.value = String(p.customdata);
      box.dispatchEvent(new Event('input', {bubbles: true}));
      box.dispatchEvent(new Event('change', {bubbles: true}));
    });
  };
  setInterval(hook, 700);
}
"""


def launch_kwargs() -> dict[str, Any]:
    """App-wide settings that Gradio 6 takes in launch() (UX.md §1.1).

    `state_session_capacity`: Gradio keeps a copy of the page's component config (~2 MB here) for
    every session, API clients included, and drops the least recently used beyond this count; its
    default (10,000) would let a stream of new clients grow the server by gigabytes. The cap is
    RESPEC_MAX_SESSIONS (default 300), measured by scripts/load_test.py (BENCHMARKS.md)."""
    from app.settings import _env_int
    return {"theme": gr.themes.Soft(primary_hue="blue", secondary_hue="orange"), "css": CSS,
            "footer_links": ["api", "gradio", "settings"], "ssr_mode": False,
            "state_session_capacity": _env_int("RESPEC_MAX_SESSIONS", 300)}


def _bind(fn: Callable, comps: dict[str, Any]) -> Callable:
    """Adapt a handler returning/yielding {name: value} to Gradio's {component: value}."""
    def convert(d: dict[str, Any]) -> dict[Any, Any]:
        return {comps[k]: v for k, v in d.items() if k in comps}

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args):
            for d in fn(*args):
                yield convert(d)
        return gen

    @functools.wraps(fn)
    def call(*args):
        return convert(fn(*args))
    return call


def _delete_session(state: SessionState) -> None:
    if isinstance(state, SessionState) and state.trace_dir:
        shutil.rmtree(state.trace_dir, ignore_errors=True)


def build_demo(hub: ModelHub | None = None, caps: Caps | None = None) -> gr.Blocks:
    hub = hub or ModelHub()
    caps = caps or Caps.from_env()
    device = hub.device()
    if ZERO_GPU:                      # ZeroGPU wants models loaded at start-up (UX.md §5.3)
        hub.preload()                 # a failure opens replay mode (banner), never crashes the Space
    start = preset_values("device defaults", device, caps)
    comps: dict[str, Any] = {}
    api_histories = tuning.HistoryStore(_env_int("RESPEC_MAX_SESSIONS", 300))   # /compare runs per API client

    with gr.Blocks(title=TITLE, fill_width=True, analytics_enabled=False) as demo:
        state = gr.State(SessionState(), delete_callback=_delete_session)
        comps["state"] = state
        gr.Markdown(INTRO)
        comps["banner"] = gr.Markdown("", visible=False, elem_id="model-banner")
        with gr.Row(equal_height=True):
            comps["status"] = gr.Markdown(EMPTY_HINT, elem_id="status")
            teaching = gr.Checkbox(False, label="teaching mode (narrate each step)", elem_id="teaching",
                                   scale=0, min_width=280)

        with gr.Tabs(elem_id="tabs"):
            # ---------------------------------------------------------------- Compare
            with gr.Tab("Compare", id="compare"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=5):
                        comps["prompt"] = gr.Textbox(label="Prompt", lines=3, max_lines=12, elem_id="prompt",
                                                     placeholder="Ask something; text that repeats itself shows retrieval at work. "
                                                                 "A chat is a JSON list: [{\"role\": \"user\", \"content\": \"…\"}, …]")
                    with gr.Column(scale=1, min_width=160):
                        run_btn = gr.Button("▶ Run", variant="primary", elem_id="run")
                        stop_btn = gr.Button("■ Stop", variant="stop", elem_id="stop")
                        model = gr.Dropdown([(handlers.choice_label(c), c) for c in hub.choices], value=hub.spec,
                                            label="model", elem_id="model", interactive=len(hub.choices) > 1,
                                            info="models this machine can hold, each with its EAGLE head")
                with gr.Row():
                    include_vanilla = gr.Checkbox(False, label="also run vanilla (measured speedup)",
                                                  elem_id="include-vanilla")
                    show_rejected = gr.Checkbox(False, label="show rejected drafts", elem_id="show-rejected")
                    repeats = gr.Slider(1, tuning.MAX_REPEATS, value=1, step=1, elem_id="repeats",
                                        label="repeat ×N (same settings; median and spread of tokens/s)")
                examples = handlers.example_prompts()
                if examples:
                    gr.Examples([[p] for p in examples], inputs=[comps["prompt"]], label="Example prompts")
                with gr.Accordion("Settings — every threshold", open=False, elem_id="settings"):
                    with gr.Row():
                        preset = gr.Radio(list(PRESETS), value="device defaults", label="preset",
                                          info=" · ".join(f"{k}: {v}" for k, v in PRESET_HELP.items()),
                                          elem_id="preset")
                    controls: dict[str, gr.components.Component] = {}
                    auto = None
                    for section in SECTIONS:
                        with gr.Group():
                            gr.Markdown(f"**{section}**")
                            with gr.Row():
                                if section == "EAGLE-2 tree":
                                    auto = gr.Checkbox(bool(start["tree.auto"]), label="auto (prune each tree to what pays)",
                                                       info="keeps only as many nodes as maximise expected tokens/s "
                                                            "(measured verify cost × head confidence); total tokens "
                                                            "is then the maximum",
                                                       elem_id="tree-auto")
                                for spec in (s for s in SPECS if s.section == section):
                                    maximum = min(spec.maximum, caps.max_new_tokens) if spec.key == "max_new_tokens" else spec.maximum
                                    if spec.key == "sampling.seed":
                                        controls[spec.key] = gr.Number(start[spec.key], label=spec.label, info=spec.help,
                                                                       precision=0, minimum=0, elem_id=_cid(spec.key))
                                    else:
                                        controls[spec.key] = gr.Slider(spec.minimum, maximum, value=start[spec.key],
                                                                       step=spec.step, label=spec.label, info=spec.help,
                                                                       elem_id=_cid(spec.key), min_width=200)
                    settings_json = gr.Code("{}", language="json", label="settings_json for the API (non-default values)",
                                            interactive=False, elem_id="settings-json")
                with gr.Row(equal_height=False):
                    for key, elem in (("respec", "respec-output"), ("eagle", "eagle-output"), ("vanilla", "vanilla-output")):
                        with gr.Column(visible=key != "vanilla", min_width=320) as col:
                            comps[f"{key}_header"] = gr.Markdown(handlers.column_header(key))
                            comps[f"{key}_out"] = gr.HighlightedText(
                                [], label="output (colour = who drafted each token)", color_map=colors(),
                                show_legend=True, combine_adjacent=False, elem_id=elem, show_label=False,
                                elem_classes=["token-strip"])
                            comps[f"{key}_live"] = gr.Markdown("", elem_classes=["live-line"])
                            comps[f"{key}_download"] = gr.DownloadButton("⬇ trace", visible=False, size="sm",
                                                                         elem_id=f"{key}-download")
                        if key == "vanilla":
                            comps["vanilla_col"] = col
                gr.Markdown(LEGEND_MD)
                comps["live_narration"] = gr.Markdown("", elem_id="live-narration")
                comps["badge"] = gr.HTML("", elem_id="identical-badge")
                comps["diff"] = gr.HighlightedText([], label="token diff (A = left column, B = right column)",
                                                   color_map=DIFF_COLORS, show_legend=True, visible=False,
                                                   elem_id="token-diff")
                comps["metrics"] = gr.HTML("", elem_id="metrics")
                comps["metrics_plot"] = gr.Plot(label="acceptance and timing", show_label=False, elem_id="metrics-plot")
                hist = tuning.build_history_panel()      # run history, baseline A (not in all_outputs)

            # ---------------------------------------------------------------- Step explorer
            with gr.Tab("Step explorer", id="explorer"):
                gr.Markdown(STEP_HELP)
                with gr.Row(equal_height=False):
                    comps["run_picker"] = gr.Radio([], label="run", elem_id="run-picker", scale=1)
                    comps["step_slider"] = gr.Slider(0, 1, value=0, step=1, label="step (one target forward)",
                                                     elem_id="step-slider", scale=3, interactive=False)
                with gr.Row():
                    prev_btn = gr.Button("◀ prev", size="sm", elem_id="prev-step")
                    next_btn = gr.Button("next ▶", size="sm", elem_id="next-step")
                    comps["play"] = gr.Button("▶ play", size="sm", elem_id="play")
                    rej_btn = gr.Button("next full rejection", size="sm", elem_id="next-rejection")
                    ret_btn = gr.Button("next retrieval", size="sm", elem_id="next-retrieval")
                    rel_btn = gr.Button("next relaxed", size="sm", elem_id="next-relaxed")
                    trig_btn = gr.Button("next trigger", size="sm", elem_id="next-trigger")
                comps["timer"] = gr.Timer(0.8, active=False)
                comps["step_info"] = gr.Markdown("", elem_id="step-info")
                comps["narration"] = gr.Markdown("", elem_id="narration")
                comps["entropy_plot"] = gr.Plot(label="entropy", show_label=False, elem_id="entropy-plot")
                entropy_click = comps["entropy_click"] = gr.Number(-1, visible="hidden", elem_id="entropy-click",
                                                                   precision=0)
                comps["step_strip"] = gr.HighlightedText([], label="this step's tokens in the output", color_map=colors(),
                                                          show_legend=False, show_inline_category=False,
                                                          elem_id="step-strip", elem_classes=["token-strip"])
                with gr.Row(equal_height=False):
                    with gr.Column(scale=3):
                        comps["tree_plot"] = gr.Plot(label="draft tree", show_label=False, elem_id="tree-plot")
                    with gr.Column(scale=2):
                        comps["decision"] = gr.Markdown("", elem_id="decision")
                comps["cand_table"] = gr.Dataframe(label="retrieval candidates (ReSpec: position, match length, "
                                                         "EMA score before/after, drafted and accepted tokens)",
                                                   interactive=False, elem_id="candidates", max_height=260, wrap=True)
                comps["node_table"] = gr.Dataframe(label="verification outcome per node", interactive=False,
                                                   elem_id="nodes", max_height=360, wrap=True)

            # ---------------------------------------------------------------- Trace files
            with gr.Tab("Trace files", id="traces"):
                gr.Markdown("Replay runs without a model: open a recorded trace, or upload trace files "
                            "(the JSON the *download* buttons and `python -m respec generate --trace` write). "
                            "One file per column; a ReSpec/SAM trace goes left, an EAGLE-2 trace right.")
                recorded = handlers.recorded_choices()
                with gr.Row():
                    trace_picker = gr.Dropdown(recorded, value=recorded[0][1] if recorded else None,
                                               label="recorded traces", elem_id="trace-picker", scale=3)
                    open_btn = gr.Button("Open", elem_id="open-trace", scale=1)
                upload = gr.File(label="upload trace file(s)", file_count="multiple", file_types=[".json"],
                                 elem_id="trace-upload")
                comps["trace_download"] = gr.DownloadButton("Download trace (JSON)", elem_id="trace-download",
                                                            interactive=False)
                comps["trace_header"] = gr.JSON({}, label="trace header (settings, seed, model, stats)", open=False,
                                                elem_id="trace-header")

            # ---------------------------------------------------------------- Lab
            with gr.Tab("Lab", id="lab"):
                lab = build_lab_tab(caps)

            # ---------------------------------------------------------------- About
            with gr.Tab("About & API", id="about"):
                gr.Markdown(ABOUT_MD)
                gr.Markdown(TUNING_MD)
                gr.Markdown(API_MD)

        all_outputs = list(comps.values())
        spec_keys = [s.key for s in SPECS]
        control_list = [controls[k] for k in spec_keys]

        # ---------------------------------------------------------------- events
        def values_of(auto_on, *vals) -> dict[str, Any]:
            return {"tree.auto": bool(auto_on), **dict(zip(spec_keys, vals))}

        @gpu(duration=GPU_DURATION_S)
        def run_compare(prompt, include_v, show_rej, teach, model_spec, auto_on, *rest):
            *vals, st, reps, metric = rest
            yield from tuning.compare_with_history(hub, caps, prompt, values_of(auto_on, *vals), include_v, show_rej,
                                                   teach, st, model_spec, reps, metric)

        run_inputs = [comps["prompt"], include_vanilla, show_rejected, teaching, model, auto, *control_list, state,
                      repeats, hist["metric"]]
        hist_outputs = [hist[k] for k in tuning.HISTORY_OUTPUTS]
        # Run: a quick unqueued claim (a second press while this tab's run is going gets a message
        # instead of a second run), then the queued run in the shared "gpu" group. Stop cancels it.
        run_ev = run_btn.click(_claim, [state], [comps["status"]], api_visibility="private", trigger_mode="multiple",
                               concurrency_limit=None, show_progress="hidden").success(
            _guard(_bind(run_compare, comps | hist), comps), run_inputs, all_outputs + hist_outputs,
            api_visibility="undocumented", concurrency_id="gpu", concurrency_limit=1, show_progress="minimal",
            trigger_mode="multiple", time_limit=caps.time_limit_s, show_progress_on=[comps["respec_out"], comps["eagle_out"]])
        stop_btn.click(_stop, [state], [comps["status"]], cancels=[run_ev], queue=False, api_visibility="private")

        def apply_preset(name):
            vals = preset_values(name, device, caps)
            return [vals[k] for k in spec_keys] + [vals["tree.auto"], _json(non_default(vals, device, caps))]
        preset.change(apply_preset, [preset], [*control_list, auto, settings_json], api_visibility="private",
                      queue=False)

        def show_json(auto_on, *vals):
            try:
                return _json(non_default(values_of(auto_on, *vals), device, caps))
            except RespecError as exc:
                return f"// {exc}"
        gr.on([c.input for c in control_list] + [auto.input], show_json, [auto, *control_list], [settings_json],
              api_visibility="private", queue=False, trigger_mode="always_last")
        tuning.wire_history_events(hub, hist, state, [*control_list, auto, settings_json], [*spec_keys, "tree.auto"],
                                   lambda v: show_json(v["tree.auto"], *[v[k] for k in spec_keys]), comps["status"])

        show_rejected.change(_bind(handlers.rerender_outputs, comps), [show_rejected, state], all_outputs,
                             api_visibility="private")
        teaching.change(_bind(handlers.rerender_narration, comps), [teaching, state], all_outputs,
                        api_visibility="private")
        comps["run_picker"].input(_bind(handlers.select_run, comps), [comps["run_picker"], teaching, state],
                                  all_outputs, api_visibility="private")
        comps["step_slider"].input(_bind(handlers.select_step, comps), [comps["step_slider"], teaching, state],
                                   all_outputs, api_visibility="private", trigger_mode="always_last",
                                   show_progress="hidden")
        for btn, kind in ((prev_btn, "prev"), (next_btn, "next"), (rej_btn, "rejection"), (ret_btn, "retrieval"),
                          (rel_btn, "relaxed"), (trig_btn, "trigger")):
            btn.click(_bind(functools.partial(handlers.jump, kind), comps), [teaching, state], all_outputs,
                      api_visibility="private", show_progress="hidden")
        comps["play"].click(_bind(handlers.toggle_play, comps), [comps["play"], state], all_outputs,
                            api_visibility="private", queue=False)
        comps["timer"].tick(_bind(handlers.tick, comps), [teaching, state], all_outputs, api_visibility="private",
                            show_progress="hidden")

        def clicked(step, teach, st):
            if step is None or step < 0:
                return {}
            out = handlers.select_step(step, teach, st)
            if out:
                out["step_slider"] = gr.update(value=st.step)
            out["entropy_click"] = -1          # so clicking the same point again is a change too
            return out
        entropy_click.change(_bind(clicked, comps), [entropy_click, teaching, state], all_outputs,
                             api_visibility="private", show_progress="hidden")

        open_btn.click(_bind(functools.partial(handlers.open_recorded, hub), comps),
                       [trace_picker, show_rejected, teaching, state], all_outputs, api_visibility="private")
        upload.upload(_bind(functools.partial(handlers.open_uploads, hub), comps),
                      [upload, show_rejected, teaching, state], all_outputs, api_visibility="private")

        def on_load(st):
            out = handlers.banner_update(hub)
            if recorded and isinstance(st, SessionState) and not st.runs:
                out.update(handlers.open_recorded(hub, recorded[0][1], False, False, st))
            return out
        demo.load(_bind(on_load, comps), [state], all_outputs, api_visibility="private")
        demo.load(None, js=CLICK_JS)

        # ---------------------------------------------------------------- Lab events
        @gpu(duration=GPU_DURATION_S)
        def run_lab(mode, cats, per_cat, max_new, methods, grid_method, grid, upload, auto_on, *vals):
            req = lab_request(mode, cats, per_cat, max_new, methods, grid_method, grid, upload,
                              values_of(auto_on, *vals))
            for update in lab_stream(hub, caps, req):
                yield {lab[k]: (gr.update(value=v, visible=v is not None) if k == "download" else v)
                       for k, v in update.items()}

        lab_inputs = [lab["mode"], lab["categories"], lab["per_category"], lab["max_new_tokens"], lab["methods"],
                      lab["grid_method"], lab["grid"], lab["upload"], auto, *control_list]
        lab_outputs = [lab["status"], lab["table"], lab["plot"], lab["download"]]
        lab_ev = lab["run"].click(run_lab, lab_inputs, lab_outputs, api_visibility="private", concurrency_id="gpu",
                                  concurrency_limit=1, time_limit=caps.time_limit_s, show_progress="minimal")
        lab["stop"].click(lambda: "■ Lab stopped.", None, [lab["status"]], cancels=[lab_ev], queue=False,
                          api_visibility="private")
        lab["mode"].change(lambda m: (gr.update(visible=not str(m).startswith("2-D")),
                                      gr.update(visible=str(m).startswith("2-D"))),
                           [lab["mode"]], [lab["methods_box"], lab["grid_box"]], queue=False, api_visibility="private")

        # ---------------------------------------------------------------- the API
        @gpu(duration=GPU_DURATION_S)
        def compare(prompt: str, settings_json: str = "{}", request: gr.Request = None) -> tuple[str, str, str, str, str]:
            """Run ReSpec (or its stand-in) and EAGLE-2 on one prompt.

            Returns (ReSpec text, EAGLE-2 text, ReSpec trace JSON, EAGLE-2 trace JSON, metrics JSON).
            settings_json: a JSON object of settings ("{}" = defaults), e.g. {"theta_H": 1.5}."""
            try:
                out = handlers.compare_api(hub, caps, prompt, settings_json)
            except RespecError as exc:
                raise gr.Error(str(exc), print_exception=False) from None
            tuning.record_api_run(api_histories, getattr(request, "session_hash", None), hub, caps, prompt, out)
            return out

        # gr.api reads the signature's annotations as objects (this module postpones them as strings)
        compare.__annotations__ = {"prompt": str, "settings_json": str, "request": gr.Request,
                                   "return": tuple[str, str, str, str, str]}
        gr.api(compare, api_name="compare", concurrency_id="gpu", concurrency_limit=1, time_limit=caps.time_limit_s)

        def replay(trace_json: str) -> tuple[str, str]:
            """Check and summarise a trace file (no model needed).

            Returns (the trace's generated text, metrics JSON). trace_json: the text of a trace file."""
            try:
                return handlers.replay_api(trace_json)
            except RespecError as exc:
                raise gr.Error(str(exc), print_exception=False) from None

        replay.__annotations__ = {"trace_json": str, "return": tuple[str, str]}
        gr.api(replay, api_name="replay", concurrency_limit=4)

        def history(request: gr.Request = None) -> str:
            """This client's /compare runs as JSON: {"rows": [{run, time, prompt, changed, settings,
            methods: {respec, eagle[, vanilla]: tokens/s, speedup, MAT, trigger rate, retrieval share, …}}]}."""
            return tuning.api_history(api_histories, getattr(request, "session_hash", None))

        history.__annotations__ = {"request": gr.Request, "return": str}
        gr.api(history, api_name="history", concurrency_limit=4)

    demo.queue(default_concurrency_limit=1, max_size=caps.queue_size)
    return demo


def build_lab_tab(caps: Caps) -> dict[str, Any]:
    """The Lab's components (not part of the Compare outputs): selection, methods or a 2-D grid,
    run/stop, status, live table and chart, CSV export."""
    from app.lab import DEFAULT_BUDGET, default_questions_path, lab_budget
    from respec.bench import CATEGORIES, PEERS
    from respec.config import METHODS

    c: dict[str, Any] = {}
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
    return c


def _cid(key: str) -> str:
    return "set-" + key.replace(".", "-").replace("_", "-")


def _json(d: dict) -> str:
    import json
    return json.dumps(d, ensure_ascii=False, indent=1) if d else "{}"


def _claim(state: SessionState) -> str:
    """Refuse a second run in the same tab while one is going (a clear message, no second run)."""
    if isinstance(state, SessionState):
        if state.running:
            raise gr.Error("A run is already going in this tab: wait for it, or press Stop first.",
                           print_exception=False)
        state.running = True
        state.stop_requested = False
    return "▶ queued…"


def _stop(state: SessionState) -> str:
    if isinstance(state, SessionState):
        state.running = False
        state.stop_requested = True     # the stream also checks this, so a late update cannot undo the stop
    return STOPPED


def _guard(fn: Callable, comps: dict[str, Any]) -> Callable:
    """Last line of defence for the Run button: an unexpected error becomes a message, not a traceback."""
    import logging

    @functools.wraps(fn)
    def gen(*args):
        try:
            yield from fn(*args)
        except RespecError as exc:
            gr.Warning(str(exc))
            yield {comps["status"]: f"⚠ {exc}"}
        except Exception as exc:  # noqa: BLE001 - keep serving, log the traceback server-side
            logging.getLogger("respec.app").exception("run failed")
            gr.Warning(f"Internal error: {type(exc).__name__}: {exc}")
            yield {comps["status"]: f"⚠ internal error: {type(exc).__name__}: {exc} (details in the server log)"}
    return gen
