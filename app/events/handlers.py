"""Event handlers: UI values -> EngineConfig -> engine runs -> throttled UI updates.

Contract: handlers are plain Python generators/functions over a per-session `SessionState`. They
yield or return dicts keyed by the page's output names (the keys of `comps` in app/page/ui.py, which
`ui._bind` maps to components), so they can be called directly in tests; the dicts themselves are
built in app/events/updates.py. Every `RespecError` (bad settings, empty or too-long prompt, model not
loadable, malformed trace) becomes a warning toast plus a message in the status line; nothing
escapes as a traceback and the app keeps serving. The model is shared by all sessions
(`app.session.hub.ModelHub`); everything per user lives in the SessionState.

* `compare_stream`: the Run button (each method streamed into its column, at most one update per
  RESPEC_STREAM_INTERVAL seconds, default 0.25, read at each run).
* `open_recorded`, `open_uploads`: replay shipped or uploaded traces (no model).
* `select_run`, `select_step`, `jump`, `tick`, `toggle_play`, `rerender_*`: the step explorer.

The old import path of the hub (`app.events.handlers.ModelHub`, `choice_label`, `_default_factory`) is
kept for tests/test_gpu_path.py and scripts/readme_screenshots.py.
"""
from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generator, Iterator, Mapping

from app.events.runs import finish_run, parse_prompt, plan_methods, stream_run
from app.events.updates import (banner_update, column_header, downloads_update, explorer_update, full_update,
                                outputs_update, step_views, vanilla_column, warn)
from app.session import traces
from app.session.hub import ModelHub, _default_factory, choice_label  # noqa: F401 - old import path (see above)
from app.session.settings import COLUMN_A_KEY, Caps, build_config, env_float, method_label, split_app_options
from app.session.state import RUN_KEYS, Run, SessionState
from app.views import render
from app.views.decoders import TokenizerDecoder
from app.views.text import STOPPED
from respec.errors import PromptError, RespecError, TraceFormatError

#: Default seconds between two streamed updates of a column (RESPEC_STREAM_INTERVAL).
DEFAULT_STREAM_INTERVAL_S = 0.25


# ------------------------------------------------------------------------------- compare (page)
def compare_stream(hub: ModelHub, caps: Caps, prompt: str, values: Mapping[str, Any], include_vanilla: bool,
                   show_rejected: bool, teaching: bool, state: SessionState, model: str | None = None
                   ) -> Iterator[dict[str, Any]]:
    """The Run button: ReSpec, then EAGLE-2, then optionally vanilla, each streamed into its
    column; then the comparison, the explorer and the trace files."""
    state = state if isinstance(state, SessionState) else SessionState()
    try:
        yield from _compare_stream(hub, caps, prompt, values, include_vanilla, show_rejected, teaching, state, model)
    finally:
        state.running = False


def _compare_stream(hub: ModelHub, caps: Caps, prompt: str, values: Mapping[str, Any], include_vanilla: bool,
                    show_rejected: bool, teaching: bool, state: SessionState, model: str | None
                    ) -> Iterator[dict[str, Any]]:
    # 1. Validate everything before touching the model.
    if not isinstance(prompt, str) or not prompt.strip():
        yield warn("The prompt is empty: type some text first.")
        return
    try:
        caps.check_prompt(prompt)
        plan = plan_methods(include_vanilla, split_app_options(values)[1].get(COLUMN_A_KEY, "respec"))
        device = hub.device()
        configs = {key: build_config(values, method, device, caps) for key, method in plan}
    except PromptError as exc:
        yield warn(str(exc))
        return
    except RespecError as exc:
        yield warn(f"Bad settings: {exc}")
        return
    # 2. The model (first use loads it: a few seconds).
    if not hub.loaded:
        yield {"status": "… loading the model and measuring its verify cost (first run only)"}
    elif hub.per_call_workers and any(c.tree.auto and c.method != "vanilla" for c in configs.values()):
        yield {"status": "… measuring the verify cost on this GPU (ZeroGPU keeps nothing between calls: "
                         "about 30 forwards, every run)"}
    try:
        runner = hub.runner(model)
    except RespecError as exc:
        yield warn(f"Could not load the model: {exc}") | banner_update(hub)
        return
    # 3. Each method in turn; the shared target allows one run at a time.
    state.clear()
    cleared = {f"{k}_out": [] for k in RUN_KEYS} | {f"{k}_live": "" for k in RUN_KEYS}
    cleared.update({f"{k}_header": column_header(k) for k in RUN_KEYS})
    yield cleared | vanilla_column(include_vanilla) | banner_update(hub) | {"status": "▶ running…"}
    streaming = _Streaming(show_rejected, teaching, caps.max_prompt_tokens,
                           env_float("RESPEC_STREAM_INTERVAL", DEFAULT_STREAM_INTERVAL_S))
    advance = functools.partial(hub.next_step, hub.begin_run())
    render_ms: list[float] = []
    for key, method in plan:
        finished = yield from _stream_column(runner, parse_prompt(prompt), key, configs[key], advance, state,
                                             streaming, render_ms)
        if not finished:
            return
    # 4. Everything else, from the finished runs.
    state.selected, state.step = "respec", 0
    out = full_update(state, show_rejected, teaching)
    mean = sum(render_ms) / len(render_ms) if render_ms else 0.0
    state.last_render_ms = render_ms          # measured server time per streamed update (README)
    out["status"] = (f"✔ done — {len(render_ms)} streamed updates, {mean:.1f} ms server render time each"
                     + hub.compile_note())
    out["live_narration"] = ""
    yield out


@dataclass(frozen=True)
class _Streaming:
    """What a streamed column shows, and how often."""
    show_rejected: bool
    teaching: bool                   # narrate the latest step while streaming
    max_prompt_tokens: int
    interval_s: float                # at least this long between two updates (the first always goes)


def _stream_column(runner, prompt: str | list[dict], key: str, config, advance: Callable, state: SessionState,
                   streaming: _Streaming, render_ms: list[float]) -> Generator[dict[str, Any], None, bool]:
    """Run one method into column `key`, yielding throttled updates; its finished Run goes into the
    state. Returns (as the generator's value) whether it finished: False after Stop or an error,
    whose last update says so. Appends the server time of each streamed update to `render_ms`."""
    decoder = TokenizerDecoder(runner.tokenizer)
    label = method_label(config.method)
    last = 0.0
    try:
        for partial, done in stream_run(runner, prompt, config, advance, streaming.max_prompt_tokens):
            if state.stop_requested:
                yield {"status": STOPPED}
                return False
            if done:
                state.put(key, finish_run(partial, decoder))
                break
            if time.perf_counter() - last < streaming.interval_s:
                continue
            t0 = time.perf_counter()
            update = {f"{key}_out": render.output_spans(partial, decoder, streaming.show_rejected),
                      f"{key}_live": "running · " + render.live_line(partial),
                      "status": f"▶ {label}: step {len(partial.steps)}, {len(partial.tokens)} tokens"}
            if streaming.teaching and partial.steps:
                update["live_narration"] = render.narrate(partial, len(partial.steps) - 1, decoder)
            render_ms.append((time.perf_counter() - t0) * 1000)
            last = time.perf_counter()
            yield update
    except RespecError as exc:
        yield warn(f"{label}: {exc}")
        return False
    run = state.runs[key]
    yield {f"{key}_out": render.output_spans(run.result, run.decoder, streaming.show_rejected),
           f"{key}_live": render.live_line(run.result)}
    return True


# ------------------------------------------------------------------------------- trace files (replay)
def open_recorded(hub: ModelHub, name: str, show_rejected: bool, teaching: bool, state: SessionState
                  ) -> dict[str, Any]:
    """Open a shipped pair of traces (replay, no model)."""
    state = state if isinstance(state, SessionState) else SessionState()
    files = traces.recorded_traces().get(name)
    if not files:
        return warn(f"No recorded trace named {name!r}.") | {"state": state}
    runs = []
    try:
        for key, path in files.items():
            runs.append(traces.load_trace_text(path.read_bytes(), path.name, hub.tokenizer))
    except (OSError, TraceFormatError) as exc:
        return warn(f"Could not open the recorded trace: {exc}") | {"state": state}
    return _replace_runs(state, runs, show_rejected, teaching, f"Replaying the recorded trace “{name}” (no model needed)")


def open_uploads(hub: ModelHub, files, show_rejected: bool, teaching: bool, state: SessionState) -> dict[str, Any]:
    """Trace upload: one or more trace files replace the runs on screen (replay, no model)."""
    state = state if isinstance(state, SessionState) else SessionState()
    paths = [f for f in (files if isinstance(files, (list, tuple)) else [files]) if f]
    if not paths:
        return {"state": state}
    runs = []
    for f in paths:
        path = Path(getattr(f, "name", f))
        origin = traces.origin_name(path.name)
        try:
            runs.append(traces.load_trace_text(traces.read_trace(path), origin, hub.tokenizer))
        except (OSError, TraceFormatError) as exc:
            return warn(f"Could not read {origin}: {exc}") | {"state": state}
    return _replace_runs(state, runs, show_rejected, teaching,
                         f"Replaying {len(runs)} uploaded trace file(s) (no model needed)")


def _replace_runs(state: SessionState, runs: list[tuple[str, Run]], show_rejected: bool, teaching: bool,
                  status: str) -> dict[str, Any]:
    """Put replayed runs on screen in place of the current ones, with the prompt they were run on."""
    state.clear()
    for key, run in runs:
        state.put(key, run)
    state.selected = next((k for k in RUN_KEYS if k in state.runs), "respec")
    out = full_update(state, show_rejected, teaching)
    first = state.runs[state.selected].result
    prompt = (first.meta or {}).get("prompt")
    if isinstance(prompt, str):
        out["prompt"] = prompt
    elif isinstance(prompt, list):
        out["prompt"] = json.dumps(prompt, ensure_ascii=False)
    out["status"] = status
    return out


# ------------------------------------------------------------------------------- explorer events
def select_run(key: str, teaching: bool, state: SessionState) -> dict[str, Any]:
    """The explorer's run picker: show that run from its first step."""
    if key in state.runs:
        state.selected = key
        state.step = 0
    out = explorer_update(state, teaching)
    out.update(downloads_update(state))
    return out


def select_step(step: float, teaching: bool, state: SessionState) -> dict[str, Any]:
    """The step slider (or a click on the entropy plot): show that step, clamped to the run."""
    run = state.current()
    if run is None or not run.result.steps:
        return {}
    try:
        step = int(step)
    except (TypeError, ValueError):
        return {}
    state.step = max(0, min(len(run.result.steps) - 1, step))
    return step_views(state, teaching)


def jump(kind: str, teaching: bool, state: SessionState) -> dict[str, Any]:
    """Buttons: "prev", "next", or the next step of an event kind (rejection, retrieval, relaxed, trigger)."""
    import gradio as gr
    run = state.current()
    if run is None or not run.result.steps:
        return {}
    n = len(run.result.steps)
    if kind == "prev":
        target = max(0, state.step - 1)
    elif kind == "next":
        target = min(n - 1, state.step + 1)
    else:
        target = render.next_event(render.step_events(run.result)[kind], state.step)
        if target is None:
            gr.Info(f"This run has no {kind} step.")
            return {}
    state.step = target
    out = step_views(state, teaching)
    out["step_slider"] = gr.update(value=target)
    return out


def tick(teaching: bool, state: SessionState) -> dict[str, Any]:
    """Play: advance one step per timer tick; stop at the end."""
    import gradio as gr
    run = state.current()
    if run is None or not run.result.steps or state.step >= len(run.result.steps) - 1:
        return {"timer": gr.Timer(active=False), "play": gr.update(value="▶ play")}
    out = jump("next", teaching, state)
    return out


def toggle_play(playing_label: str, state: SessionState) -> dict[str, Any]:
    """Play / pause the step timer (play at the last step starts over)."""
    import gradio as gr
    run = state.current()
    start = playing_label.startswith("▶")
    if start and run is not None and run.result.steps and state.step >= len(run.result.steps) - 1:
        state.step = -1                                   # replay from the start
    return {"timer": gr.Timer(active=start), "play": gr.update(value="❚❚ pause" if start else "▶ play")}


def rerender_outputs(show_rejected: bool, state: SessionState) -> dict[str, Any]:
    """The "show rejected drafts" box toggled: the output strips again."""
    return outputs_update(state, show_rejected)


def rerender_narration(teaching: bool, state: SessionState) -> dict[str, Any]:
    """Teaching mode toggled: the current step's narration (or none)."""
    run = state.current()
    if run is None or not run.result.steps:
        return {"narration": ""}
    return {"narration": render.narrate(run.result, state.step, run.decoder) if teaching else ""}
