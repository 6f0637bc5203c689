"""The page: `build_demo` assembles the tabs (app/page/layout.py) and wires their events (ARCHITECTURE.md §6.8).

Contract: `build_demo(hub=None, caps=None)` returns a `gr.Blocks` without loading anything (the
model loads on the first run, the shipped trace opens when a page loads; on a ZeroGPU Space the
model is preloaded, and a failure opens replay mode). Handlers return dicts keyed by the names in
`Page.outputs`; `_bind` maps them to components. Every engine run (page and API) shares the
queue's concurrency group "gpu" with limit 1, so runs never overlap and timings stay fair. The API:
`/compare`, `/replay` and `/history` (their work lives in app/events/api.py and app/events/tuning.py). Element
ids are listed in app/page/layout.py. The page's CSS and script are app/static/app.css and app.js, read
when the page is built or launched. RESPEC_GPU_DURATION (seconds of GPU a ZeroGPU Space reserves
per run; spaces.GPU's default is 60, ours 120) and RESPEC_MAX_SESSIONS are read in `build_demo` /
`launch_kwargs`; a bad value falls back to the default with a warning.

ZeroGPU: a `@gpu` function runs in `spaces`' GPU worker process, which pickles its arguments and
every value it yields or returns. So `@gpu` generators yield {output name: value} with plain values
(names are mapped to components by `_bind` in the main process), the page's runs hand the session
state (its history included) back through the "state" output, Stop reaches the worker through the
state's flag file (app/session/state.py), and `/compare` records its history row in the main process,
where `/history` reads it (the GPU part is `api.compare_api` alone).

Launch with `demo.queue(...)` already applied here and `demo.launch(**launch_kwargs())`.
"""
from __future__ import annotations

import functools
import inspect
import json
import logging
import shutil
from pathlib import Path
from typing import Any, Callable

import gradio as gr

from app.events import api, handlers, tuning
from app.events import updates as views
from app.events.lab import LAB_STOPPED, lab_request, lab_stream
from app.page import layout
from app.page.gpu import ZERO_GPU, gpu
from app.page.layout import Page
from app.session.hub import ModelHub
from app.session.settings import COLUMN_A_KEY, SPECS, Caps, env_int, non_default, preset_values
from app.session.state import SessionState
from app.views.text import STOPPED, TITLE
from respec.errors import RespecError

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
#: Settings keys in the order of the settings controls (the event inputs that carry them).
SPEC_KEYS = [s.key for s in SPECS]


def static_text(name: str) -> str:
    """A file of app/static (the page's CSS and script), read when it is needed, never at import."""
    return (STATIC_DIR / name).read_text(encoding="utf-8")


def gpu_duration_s() -> int:
    """RESPEC_GPU_DURATION: seconds of GPU a ZeroGPU Space reserves per run (default 120)."""
    return env_int("RESPEC_GPU_DURATION", 120)


def launch_kwargs() -> dict[str, Any]:
    """App-wide settings that Gradio 6 takes in launch() (UX.md §1.1).

    `state_session_capacity`: Gradio keeps a copy of the page's component config (~2 MB here) for
    every session, API clients included, and drops the least recently used beyond this count; its
    default (10,000) would let a stream of new clients grow the server by gigabytes. The cap is
    RESPEC_MAX_SESSIONS (default 300), measured by scripts/load_test.py (docs/benchmarks-history.md)."""
    return {"theme": gr.themes.Soft(primary_hue="blue", secondary_hue="orange"), "css": static_text("app.css"),
            "footer_links": ["api", "gradio", "settings"], "ssr_mode": False,
            "state_session_capacity": env_int("RESPEC_MAX_SESSIONS", 300)}


def _bind(fn: Callable, comps: dict[str, Any]) -> Callable:
    """Adapt a handler returning/yielding {name: value} to Gradio's {component: value}."""
    def convert(d: dict[str, Any]) -> dict[Any, Any]:
        return {comps[k]: v for k, v in d.items() if k in comps}

    if inspect.isgeneratorfunction(inspect.unwrap(fn)) or inspect.isgeneratorfunction(fn):
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
    if isinstance(state, SessionState):
        state.stop_requested = False             # its Stop flag files, if any
        state.lab_stop_requested = False
        if state.trace_dir:
            shutil.rmtree(state.trace_dir, ignore_errors=True)


def build_demo(hub: ModelHub | None = None, caps: Caps | None = None) -> gr.Blocks:
    hub = hub or ModelHub()
    caps = caps or Caps.from_env()
    device = hub.device()
    if ZERO_GPU:                      # ZeroGPU wants models loaded at start-up (UX.md §5.3)
        hub.preload()                 # a failure opens replay mode (banner), never crashes the Space
    start = preset_values("device defaults", device, caps)
    page = Page()
    gpu_s = gpu_duration_s()

    with gr.Blocks(title=TITLE, fill_width=True, analytics_enabled=False) as demo:
        state = page.outputs["state"] = gr.State(SessionState(), delete_callback=_delete_session)
        layout.header(page)
        with gr.Tabs(elem_id="tabs"):
            with gr.Tab("Compare", id="compare"):
                layout.compare_tab(page, hub, caps, start)
            with gr.Tab("Step explorer", id="explorer"):
                layout.explorer_tab(page)
            with gr.Tab("Trace files", id="traces"):
                layout.traces_tab(page)
            with gr.Tab("Lab", id="lab"):
                layout.lab_tab(page, caps)
            with gr.Tab("About & API", id="about"):
                layout.about_tab()

        _wire_compare(page, state, hub, caps, device, gpu_s)
        _wire_explorer(page, state)
        _wire_traces(demo, page, state, hub)
        _wire_lab(page, state, hub, caps, gpu_s)
        _register_api(hub, caps, gpu_s)

    demo.queue(default_concurrency_limit=1, max_size=caps.queue_size)
    return demo


def _values_of(auto_on, *vals) -> dict[str, Any]:
    """The settings controls' values (in SPEC_KEYS order) and the auto switch -> settings by key."""
    return {"tree.auto": bool(auto_on), **dict(zip(SPEC_KEYS, vals))}


# ------------------------------------------------------------------------------- Compare events
def _wire_compare(page: Page, state, hub: ModelHub, caps: Caps, device: str, gpu_s: int) -> None:
    """Run (claim, then the queued run with its history row), Stop, presets, the settings JSON
    box, and the run history's pin / restore / clear."""
    comps, inp, hist = page.outputs, page.inputs, page.history
    controls = [page.controls[k] for k in SPEC_KEYS]
    auto = inp["auto"]

    @gpu(duration=gpu_s)
    def run_compare(prompt, include_v, show_rej, teach, model_spec, column_a, auto_on, *rest):
        *vals, st, reps, metric = rest
        values = _values_of(auto_on, *vals) | {COLUMN_A_KEY: column_a or "respec"}
        yield from tuning.compare_with_history(hub, caps, prompt, values, include_v, show_rej,
                                               teach, st, model_spec, reps, metric)

    run_inputs = [comps["prompt"], inp["include_vanilla"], inp["show_rejected"], inp["teaching"], inp["model"],
                  inp["column_a"], auto, *controls, state, inp["repeats"], hist["metric"]]
    hist_outputs = [hist[k] for k in tuning.HISTORY_OUTPUTS]
    # Run: a quick unqueued claim (a second press while this tab's run is going gets a message
    # instead of a second run), then the queued run in the shared "gpu" group. Stop cancels it.
    run_ev = inp["run"].click(_claim, [state], [comps["status"]], api_visibility="private", trigger_mode="multiple",
                              concurrency_limit=None, show_progress="hidden").success(
        _guard(_bind(run_compare, comps | hist), comps), run_inputs, list(comps.values()) + hist_outputs,
        api_visibility="undocumented", concurrency_id="gpu", concurrency_limit=1, show_progress="minimal",
        trigger_mode="multiple", time_limit=caps.time_limit_s, show_progress_on=[comps["respec_out"], comps["eagle_out"]])
    inp["stop"].click(_stop, [state], [comps["status"]], cancels=[run_ev], queue=False, api_visibility="private")

    def apply_preset(name):
        vals = preset_values(name, device, caps)
        return [vals[k] for k in SPEC_KEYS] + [vals["tree.auto"], _json(non_default(vals, device, caps))]
    inp["preset"].change(apply_preset, [inp["preset"]], [*controls, auto, inp["settings_json"]],
                         api_visibility="private", queue=False)

    def show_json(auto_on, *vals):
        try:
            return _json(non_default(_values_of(auto_on, *vals), device, caps))
        except RespecError as exc:
            return f"// {exc}"
    gr.on([c.input for c in controls] + [auto.input], show_json, [auto, *controls], [inp["settings_json"]],
          api_visibility="private", queue=False, trigger_mode="always_last")
    tuning.wire_history_events(hub, hist, state, [*controls, auto, inp["settings_json"]], [*SPEC_KEYS, "tree.auto"],
                               lambda v: show_json(v["tree.auto"], *[v[k] for k in SPEC_KEYS]), comps["status"])


# ------------------------------------------------------------------------------- explorer events
def _wire_explorer(page: Page, state) -> None:
    """Show rejected / teaching mode, the run picker, the step slider and buttons, Play, and a
    click on the entropy plot."""
    comps, inp = page.outputs, page.inputs
    outputs, teaching = list(comps.values()), inp["teaching"]

    def on(event, fn, inputs, **kw):
        event(_bind(fn, comps), inputs, outputs, api_visibility="private", **kw)

    on(inp["show_rejected"].change, handlers.rerender_outputs, [inp["show_rejected"], state])
    on(teaching.change, handlers.rerender_narration, [teaching, state])
    on(comps["run_picker"].input, handlers.select_run, [comps["run_picker"], teaching, state])
    on(comps["step_slider"].input, handlers.select_step, [comps["step_slider"], teaching, state],
       trigger_mode="always_last", show_progress="hidden")
    for kind in ("prev", "next", "rejection", "retrieval", "relaxed", "trigger"):
        on(inp[kind].click, functools.partial(handlers.jump, kind), [teaching, state], show_progress="hidden")
    on(comps["play"].click, handlers.toggle_play, [comps["play"], state], queue=False)
    on(comps["timer"].tick, handlers.tick, [teaching, state], show_progress="hidden")

    def clicked(step, teach, st):
        if step is None or step < 0:
            return {}
        out = handlers.select_step(step, teach, st)
        if out:
            out["step_slider"] = gr.update(value=st.step)
        out["entropy_click"] = -1          # so clicking the same point again is a change too
        return out
    on(comps["entropy_click"].change, clicked, [comps["entropy_click"], teaching, state], show_progress="hidden")


# ------------------------------------------------------------------------------- trace events
def _wire_traces(demo: gr.Blocks, page: Page, state, hub: ModelHub) -> None:
    """Open a shipped trace, upload traces, and on page load: the banner, the first shipped trace
    (replay, no model) and the page script."""
    comps, inp, outputs = page.outputs, page.inputs, list(page.outputs.values())
    replay_inputs = [inp["show_rejected"], inp["teaching"], state]
    inp["open"].click(_bind(functools.partial(handlers.open_recorded, hub), comps), [inp["trace_picker"], *replay_inputs],
                      outputs, api_visibility="private")
    inp["upload"].upload(_bind(functools.partial(handlers.open_uploads, hub), comps), [inp["upload"], *replay_inputs],
                         outputs, api_visibility="private")

    def on_load(st):
        out = views.banner_update(hub)
        if page.recorded and isinstance(st, SessionState) and not st.runs:
            out.update(handlers.open_recorded(hub, page.recorded[0][1], False, False, st))
        return out
    demo.load(_bind(on_load, comps), [state], outputs, api_visibility="private")
    demo.load(None, js=static_text("app.js"))


# ------------------------------------------------------------------------------- Lab events
def _wire_lab(page: Page, state: gr.State, hub: ModelHub, caps: Caps, gpu_s: int) -> None:
    """Run Lab (a quick claim of a fresh Lab Stop flag, then the run in the shared "gpu" group,
    streamed), Stop (cancels the event and raises the flag the worker polls), the methods / grid switch."""
    lab, auto = page.lab, page.inputs["auto"]
    run_lab = _bind(lab_runner(hub, caps, gpu_s), lab)      # names -> components here, in the main process
    lab_inputs = [lab["mode"], lab["categories"], lab["per_category"], lab["max_new_tokens"], lab["methods"],
                  lab["grid_method"], lab["grid"], lab["upload"], auto, *[page.controls[k] for k in SPEC_KEYS],
                  state]
    lab_outputs = [lab["status"], lab["table"], lab["plot"], lab["download"]]
    lab_ev = lab["run"].click(_claim_lab, [state], [lab["status"]], api_visibility="private", queue=False,
                              show_progress="hidden").success(
        run_lab, lab_inputs, lab_outputs, api_visibility="private", concurrency_id="gpu", concurrency_limit=1,
        time_limit=caps.time_limit_s, show_progress="minimal")
    lab["stop"].click(_stop_lab, [state], [lab["status"]], cancels=[lab_ev], queue=False, api_visibility="private")
    lab["mode"].change(lambda m: (gr.update(visible=not str(m).startswith("2-D")),
                                  gr.update(visible=str(m).startswith("2-D"))),
                       [lab["mode"]], [lab["methods_box"], lab["grid_box"]], queue=False, api_visibility="private")


def lab_runner(hub: ModelHub, caps: Caps, gpu_s: int) -> Callable:
    """The Lab run under `@gpu`: a generator of {output name: value} (status, table, plot,
    download). `spaces` pickles every yield across its worker boundary, so it yields names and
    plain values, never components (a component drags its whole Blocks along)."""
    @gpu(duration=gpu_s)
    def run_lab(mode, cats, per_cat, max_new, methods, grid_method, grid, upload, auto_on, *rest):
        *vals, state = rest
        req = lab_request(mode, cats, per_cat, max_new, methods, grid_method, grid, upload,
                          _values_of(auto_on, *vals))
        stopped = (lambda: state.lab_stop_requested) if isinstance(state, SessionState) else (lambda: False)
        for update in lab_stream(hub, caps, req, should_stop=stopped):
            yield {k: (gr.update(value=v, visible=v is not None) if k == "download" else v)
                   for k, v in update.items()}
    return run_lab


# ------------------------------------------------------------------------------- the API
def _register_api(hub: ModelHub, caps: Caps, gpu_s: int) -> None:
    """`/compare` (in the shared "gpu" group; each call joins its client's history), `/replay`, `/history`."""
    api_histories = tuning.HistoryStore(env_int("RESPEC_MAX_SESSIONS", 300))   # /compare runs per API client

    @gpu(duration=gpu_s)
    def on_gpu(prompt: str, settings_json: str) -> tuple[str, str, str, str, str]:
        return api.compare_api(hub, caps, prompt, settings_json)

    def compare(prompt: str, settings_json: str = "{}", request: gr.Request = None) -> tuple[str, str, str, str, str]:
        """Run ReSpec and EAGLE-2 on one prompt.

        Returns (ReSpec text, EAGLE-2 text, ReSpec trace JSON, EAGLE-2 trace JSON, metrics JSON).
        settings_json: a JSON object of settings ("{}" = defaults), e.g. {"theta_H": 1.5}."""
        try:
            out = on_gpu(prompt, settings_json)
        except RespecError as exc:
            raise gr.Error(str(exc), print_exception=False) from None
        # recorded here, in the main process, where /history reads (on ZeroGPU the run itself
        # happens in the GPU worker, whose memory the main process never sees)
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
            return api.replay_api(trace_json)
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


# ------------------------------------------------------------------------------- helpers
def _json(d: dict) -> str:
    return json.dumps(d, ensure_ascii=False, indent=1) if d else "{}"


def _claim(state: SessionState) -> str:
    """Refuse a second run in the same tab while one is going (a clear message, no second run)."""
    if isinstance(state, SessionState):
        if state.running:
            raise gr.Error("A run is already going in this tab: wait for it, or press Stop first.",
                           print_exception=False)
        state.begin_run()
    return "▶ queued…"


def _claim_lab(state: SessionState) -> str:
    """Run Lab was pressed: a fresh Lab Stop flag for this run (in the main process)."""
    if isinstance(state, SessionState):
        state.begin_lab()
    return "▶ Lab queued…"


def _stop_lab(state: SessionState) -> str:
    """The Lab's Stop: raise the flag the run polls (in whichever process it decodes)."""
    if isinstance(state, SessionState):
        state.lab_stop_requested = True
    return LAB_STOPPED


def _stop(state: SessionState) -> str:
    if isinstance(state, SessionState):
        state.running = False
        state.stop_requested = True     # the stream also checks this, so a late update cannot undo the stop
    return STOPPED


def _guard(fn: Callable, comps: dict[str, Any]) -> Callable:
    """Last line of defence for the Run button: an unexpected error becomes a message, not a traceback."""
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
