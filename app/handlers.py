"""Event handlers: UI values -> EngineConfig -> engine runs -> throttled UI updates.

Contract: handlers are plain Python generators/functions over a per-session `SessionState`. They
yield or return dicts keyed by the output names of `ui.OUTPUTS` (ui.py maps names to components),
so they can be called directly in tests. Every `RespecError` (bad settings, empty or too-long
prompt, model not loadable, malformed trace) becomes a warning toast plus a message in the status
line; nothing escapes as a traceback and the app keeps serving. The model is shared by all sessions
(`ModelHub`, loaded lazily once behind a lock); everything per user lives in the SessionState.
Models are offered as "MODEL" or "MODEL=HEAD" (RESPEC_MODELS entries, respec.runner.ModelChoice):
the picker shows each model's EAGLE head, and the /compare metrics name the head that ran.

ZeroGPU: `ModelHub.preload()` loads the model at start-up in the main process; a failure leaves the
app in replay mode (banner) instead of crashing the Space. Every GPU call runs in a fresh worker, so
what a call computes is lost at its end: `no_relax_ids` (a pure tokenizer scan) is computed at
start-up and inherited; the verify-cost curve needs the GPU and is re-measured in each call (about
30 target forwards; the status says so); only the start-up model is offered (another would be
reloaded in every call).

Timing: a run's `wall_time_s` is the time spent inside the engine (prefill + steps); the time the
page spends rendering between steps is excluded, so tokens/s are comparable between methods.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from app import figures, render
from app.render import TableDecoder, TokenizerDecoder
from app.settings import Caps, build_config, method_label, parse_settings_json, respec_method, split_app_options
from app.state import RUN_KEYS, Run, SessionState, run_key_for
from app.text import EMPTY_HINT, STOPPED
from respec.errors import ConfigError, ModelLoadError, PromptError, RespecError, TraceFormatError
from respec.runner import ModelChoice, parse_model_choices
from respec.trace import GenerationResult, result_from_json, result_to_json, validate_result

log = logging.getLogger("respec.app")

ROOT = Path(__file__).resolve().parent.parent
TRACES_DIR = ROOT / "assets" / "traces"
PROMPTS_DIR = ROOT / "assets" / "prompts"
MAX_TRACE_BYTES = 50 * 1024 * 1024
STREAM_INTERVAL_S = float(os.environ.get("RESPEC_STREAM_INTERVAL", "0.25"))


# ------------------------------------------------------------------------------- the shared model
#: Approximate bf16 footprint (GB) of models this project knows; others are sized from their files.
KNOWN_MODEL_GB = {"default": 0.3}


def model_fits(spec: str) -> bool:
    """Whether a model can be held here: its estimated bf16 size (known table; a local directory's
    weight files; a .gguf x 3 for dequantisation) within 80% of the free memory of the device it
    would run on. Hub ids of unknown size are kept (their size cannot be known offline). A
    "MODEL=HEAD" spec is sized by its model."""
    from pathlib import Path
    spec = ModelChoice.parse(spec).model
    p = Path(spec)
    if spec in KNOWN_MODEL_GB:
        gb = KNOWN_MODEL_GB[spec]
    elif p.is_dir():
        gb = sum(f.stat().st_size for f in p.glob("*") if f.suffix in (".safetensors", ".bin")) / 1e9
    elif p.suffix == ".gguf" and p.is_file():
        gb = 3 * p.stat().st_size / 1e9
    else:
        return True
    try:
        import torch
        if torch.cuda.is_available():
            free = torch.cuda.mem_get_info()[0] / 1e9
        else:
            import psutil
            free = psutil.virtual_memory().available / 1e9
    except Exception:  # noqa: BLE001 - no way to tell: offer it
        return True
    fits = gb <= 0.8 * free
    if not fits:
        log.warning("model %s (~%.1f GB) does not fit in %.1f GB free memory; not offered", spec, gb, free)
    return fits


class ModelHub:
    """One target model and its Runner for the whole process, loaded on first use (never at
    import), behind a lock.

    The target holds one KV cache, so two runs must never interleave. The queue already runs one
    engine event at a time (concurrency group "gpu"); on top of that every target forward of a run
    goes through `next_step(run_id, ...)` under a lock, and a newer run (`begin_run`) supersedes
    older ones: a run cancelled by Stop or a closed tab, whose thread may still be finishing a
    forward, stops at its next step instead of touching the cache again. No lock is held while a
    handler yields, so a cancelled run can never block the next one."""

    def __init__(self, spec: str | None = None, factory: Callable[[str], Any] | None = None,
                 choices: Sequence[str] | None = None) -> None:
        env_models = [str(c) for c in parse_model_choices(os.environ.get("RESPEC_MODELS", ""))]
        self.choices = [m for m in (choices or env_models or ["default"]) if model_fits(m)] or ["default"]
        self.spec = str(ModelChoice.parse(spec or os.environ.get("RESPEC_MODEL") or self.choices[0]))
        if self.spec not in self.choices:
            self.choices.insert(0, self.spec)
        self._factory = factory or _default_factory
        self._runner = None
        self._runner_spec: str | None = None
        self._load_lock = threading.Lock()
        self._step_lock = threading.Lock()
        self._owner = 0
        self.load_error: str | None = None     # why the last load failed (shared: it is the model's state)
        self.per_call_workers = False          # ZeroGPU: each GPU call is a fresh worker (preload sets it)

    def preload(self, per_call_workers: bool = True) -> bool:
        """Load the start-up model now, in this (main) process, and whatever a GPU-call worker would
        otherwise recompute on every call (`no_relax_ids`); offer only this model (ZeroGPU). A load
        failure is recorded for the banner (replay mode), never raised. Returns whether it loaded."""
        self.per_call_workers = per_call_workers
        self.choices = [self.spec]
        try:
            runner = self.runner()
        except RespecError:
            return False                        # load_error is set: the page opens in replay mode
        no_relax = getattr(type(runner), "no_relax_ids", None)
        if isinstance(no_relax, functools.cached_property):
            runner.no_relax_ids                 # noqa: B018 - cached on the runner, inherited by workers
        return True

    def begin_run(self) -> int:
        """Start a run: it owns the target from now on (older runs stop at their next step)."""
        with self._step_lock:
            self._owner += 1
            return self._owner

    def next_step(self, run_id: int, steps_iter):
        """One target forward of run `run_id` (raises StopIteration at the end, like next())."""
        with self._step_lock:
            if run_id != self._owner:
                raise RespecError("this run was superseded by a newer one")
            return next(steps_iter)

    @contextlib.contextmanager
    def exclusive(self):
        """Hold the model for one long unit of work (a Lab record): any other run's next step waits,
        and runs started before it stop at their next step."""
        with self._step_lock:
            self._owner += 1
            yield

    @property
    def loaded(self) -> bool:
        return self._runner is not None

    def runner(self, spec: str | None = None):
        spec = spec or self.spec
        if spec not in self.choices:
            raise ConfigError(f"model {spec!r} is not offered here; choose one of {', '.join(self.choices)}")
        with self._load_lock:
            if self._runner is None or self._runner_spec != spec:
                self._runner = None                      # free the old model before loading another
                t0 = time.perf_counter()
                try:
                    self._runner = self._factory(spec)
                except Exception as exc:  # noqa: BLE001 - any load failure leaves the app in replay mode
                    self.load_error = _load_failure(spec, exc)
                    log.warning("model %s failed to load: %s", spec, self.load_error, exc_info=not isinstance(exc, RespecError))
                    raise ModelLoadError(self.load_error) from None
                self._runner_spec = spec
                self.load_error = None
                log.info("loaded model %s in %.1f s (EAGLE head: %s)", spec, time.perf_counter() - t0,
                         getattr(self._runner, "head_info", "?"))
            return self._runner

    def banner(self) -> str:
        """The page banner while the model cannot be loaded ("" when all is well)."""
        if not self.load_error:
            return ""
        return (f"⚠ **The model could not be loaded**: {self.load_error}  \n"
                "The explorer is in **replay mode**: open a recorded trace or upload one under "
                "*Trace files*. Run tries loading the model again.")

    @property
    def tokenizer(self):
        return getattr(self._runner, "tokenizer", None) if self._runner is not None else None

    def device(self) -> str:
        if self._runner is not None:
            return str(self._runner.target.device)
        try:
            import torch
            return "cuda" if torch.cuda.is_available() else "cpu"
        except Exception:  # noqa: BLE001 - torch missing means CPU
            return "cpu"


def _load_failure(spec: str, exc: BaseException) -> str:
    """One line naming the model and the cause (our message as is; others with their type)."""
    msg = str(exc) if isinstance(exc, RespecError) else f"{type(exc).__name__}: {exc}"
    msg = " ".join(msg.split())[:500]
    return msg if spec in msg else f"{spec}: {msg}"


def _default_factory(spec: str):
    """"MODEL" or "MODEL=HEAD" -> a Runner (the head: a directory or a Hub id; none = the Runner's default)."""
    from respec.models import load_target
    from respec.runner import Runner
    choice = ModelChoice.parse(spec)
    # Runner.engine measures tree.auto's cost curve outside run timing
    return Runner(load_target(choice.model), head=choice.head)


def choice_label(spec: str) -> str:
    """The model picker's label for a choice: the model and the EAGLE head it runs with."""
    choice = ModelChoice.parse(spec)
    return f"{choice.model} · {choice.head_label()}"


# ------------------------------------------------------------------------------- one run, streamed
def assemble(engine, prompt_ids: Sequence[int], steps: Sequence, engine_s: float, final: bool = False,
             tokenizer=None) -> GenerationResult:
    """A GenerationResult from the steps streamed so far (the same accounting as Engine.generate:
    generated = [first token] + new tokens, cut at max_new_tokens and after a stop token)."""
    if engine.prefill is None:                         # nothing pulled yet: an empty partial result
        cfg = engine.config
        root = steps[0].tree.tokens[0] if steps else 0
        return GenerationResult(prompt_tokens=tuple(int(t) for t in prompt_ids), tokens=(int(root),) if steps else (),
                                text="", first_entropy=math.nan, first_margin=math.nan, steps=tuple(steps),
                                config=cfg, wall_time_s=engine_s, prefill_ms=0.0, stop_reason="running", meta={})
    result = engine.assemble(prompt_ids, steps, engine_s, final=final)
    if final and tokenizer is not None and engine.tokenizer is None:
        result = dataclasses.replace(result, text=tokenizer.decode(list(result.tokens), skip_special_tokens=True))
    return result


def stream_run(runner, prompt: str, config, advance: Callable | None = None, max_prompt_tokens: int | None = None
               ) -> Iterator[tuple[GenerationResult, bool]]:
    """Run one method, yielding (partial result, False) after every target forward and finally
    (complete result with metadata, True). `advance(steps_iter)` pulls one step (default: next;
    the app passes ModelHub.next_step). Raises RespecError for a bad prompt."""
    advance = advance or next
    engine, ids, steps_iter = runner.stream(prompt, config, max_prompt_tokens=max_prompt_tokens)
    steps: list = []
    engine_s = 0.0
    try:
        while True:
            t0 = time.perf_counter()
            try:
                step = advance(steps_iter)
            except StopIteration:
                engine_s += time.perf_counter() - t0
                break
            engine_s += time.perf_counter() - t0
            steps.append(step)
            yield assemble(engine, ids, steps, engine_s), False
    finally:
        steps_iter.close()
    result = assemble(engine, ids, steps, engine_s, final=True, tokenizer=runner.tokenizer)
    validate_result(result)
    result.meta.update(runner.meta(config, prompt))
    result.meta["engine_time"] = "prefill + steps; UI rendering excluded"
    # The target's verify-cost curve, if tree.auto already measured it (never measured here: it costs
    # ~30 forwards); it grounds the estimated speedup when vanilla was not run.
    curve = getattr(runner.target, "_cost_curve", None)
    if isinstance(curve, dict) and curve:
        result.meta["verify_cost_ms"] = {str(k): round(float(v), 3) for k, v in curve.items()}
    yield result, True


def finish_run(result: GenerationResult, decoder) -> Run:
    """Embed the text table in the trace (replay needs no tokenizer) and wrap it as a Run."""
    table = render.text_table(result, decoder)
    result.meta["display"] = table
    return Run(result=result, decoder=TableDecoder(result.tokens, table["pieces"], table["vocab"]))


def parse_prompt(text: str) -> str | list[dict]:
    """A prompt string, or a chat: a JSON list of {"role", "content"} messages (the chat template
    of the model is applied either way)."""
    stripped = text.strip()
    if stripped.startswith("[") and stripped.endswith("]"):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError:
            return text
        if (isinstance(data, list) and data and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                   and isinstance(m.get("content"), str) for m in data)):
            return [{"role": m["role"], "content": m["content"]} for m in data]
    return text


def plan_methods(include_vanilla: bool) -> list[tuple[str, str]]:
    """(column, method) in run order: ReSpec (or its stand-in), EAGLE-2, optionally vanilla."""
    plan = [("respec", respec_method()), ("eagle", "eagle2")]
    if include_vanilla:
        plan.append(("vanilla", "vanilla"))
    return plan


def fallback_note() -> str:
    if respec_method() == "respec":
        return ""
    return ("ReSpec is not in this engine build yet: its column runs SAM-Decoding (retrieval + EAGLE-2), "
            "the closest method, until it lands.")


# ------------------------------------------------------------------------------- rendering a session
def _label(state: SessionState, key: str) -> str:
    run = state.runs.get(key)
    if run is None:
        return {"respec": method_label(respec_method()), "eagle": "EAGLE-2", "vanilla": "vanilla"}[key]
    return run.label + ("" if run.origin == "live" else f" · {run.origin}")


def column_header(key: str, state: SessionState | None = None) -> str:
    run = state.runs.get(key) if state is not None else None
    method = run.method if run is not None else {"respec": respec_method(), "eagle": "eagle2", "vanilla": "vanilla"}[key]
    title = method_label(method)
    if key == "respec" and method == "sam":
        title += " — stand-in for ReSpec"
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
        out["diff"] = _visible([] if same else spans, not same)
    else:
        out["badge"] = "<div class='respec-badge'>Run both methods (or open a pair of traces) to compare outputs.</div>"
        out["diff"] = _visible([], False)
    note = "Speedups marked ≈ are estimates: tick “also run vanilla” to measure them." if vanilla is None and runs else ""
    out["metrics"] = render.metrics_html(runs, vanilla, note)
    out["metrics_plot"] = figures.metrics_figure(runs)
    return out


def _visible(value, visible: bool):
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
                "decision": "", "cand_table": _table(["candidates"], []), "node_table": _table(["node"], []),
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
    return {"step_info": render.step_summary(res, i, dec),
            "narration": render.narrate(res, i, dec) if teaching else "",
            "tree_plot": figures.tree_figure(step, dec, title),
            "entropy_plot": figures.entropy_figure(res, dec, selected=i, label=run.label),
            "decision": render.decision_md(step),
            "cand_table": _table(cand_h, cand_r),
            "node_table": _table(node_h, node_r),
            "step_strip": render.step_spans(res, i, dec)}


def _table(headers: list[str], rows: list[list[Any]]):
    import pandas as pd
    return pd.DataFrame(rows, columns=headers)


def downloads_update(state: SessionState) -> dict[str, Any]:
    """Write each run's trace file into the session folder and point the download buttons at them."""
    import gradio as gr
    out: dict[str, Any] = {}
    for key in RUN_KEYS:
        run = state.runs.get(key)
        out[f"{key}_download"] = gr.update(value=trace_file(state, key) if run else None, interactive=run is not None,
                                           visible=run is not None)
    run = state.current()
    out["trace_download"] = gr.update(value=trace_file(state, state.selected) if run else None,
                                      interactive=run is not None,
                                      label=f"Download the {run.label} trace (JSON)" if run else "Download trace (JSON)")
    out["trace_header"] = render.trace_header(run.result) if run else {}
    return out


def trace_file(state: SessionState, key: str) -> str:
    run = state.runs[key]
    if state.trace_dir is None or not os.path.isdir(state.trace_dir):
        state.trace_dir = tempfile.mkdtemp(prefix="respec-traces-")
    res = run.result
    name = f"{key}-{res.config.method}-seed{res.config.sampling.seed}-{len(res.tokens)}tok.json"
    path = os.path.join(state.trace_dir, name)
    text = result_to_json(res)
    if not os.path.exists(path) or Path(path).read_text(encoding="utf-8") != text:
        Path(path).write_text(text, encoding="utf-8")
    return path


def full_update(state: SessionState, show_rejected: bool, teaching: bool) -> dict[str, Any]:
    import gradio as gr
    out = outputs_update(state, show_rejected)
    out["vanilla_col"] = gr.update(visible="vanilla" in state.runs)
    out.update(comparison_update(state))
    out.update(explorer_update(state, teaching))
    out.update(downloads_update(state))
    out["state"] = state
    return out


def _warn(message: str, status_prefix: str = "⚠") -> dict[str, Any]:
    import gradio as gr
    gr.Warning(message)
    return {"status": f"{status_prefix} {message}"}


# ------------------------------------------------------------------------------- compare (page)
def compare_stream(hub: ModelHub, caps: Caps, prompt: str, values: Mapping[str, Any], include_vanilla: bool,
                   show_rejected: bool, teaching: bool, state: SessionState, model: str | None = None
                   ) -> Iterator[dict[str, Any]]:
    """The Run button: ReSpec (or its stand-in), then EAGLE-2, then optionally vanilla, each
    streamed into its column; then the comparison, the explorer and the trace files."""
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
        yield _warn("The prompt is empty: type some text first.")
        return
    try:
        caps.check_prompt(prompt)
        device = hub.device()
        plan = plan_methods(include_vanilla)
        configs = {key: build_config(values, method, device, caps) for key, method in plan}
    except PromptError as exc:
        yield _warn(str(exc))
        return
    except RespecError as exc:
        yield _warn(f"Bad settings: {exc}")
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
        yield _warn(f"Could not load the model: {exc}") | banner_update(hub)
        return
    # 3. Each method in turn; the shared target allows one run at a time.
    state.clear()
    render_ms: list[float] = []
    note = fallback_note()
    cleared = {f"{k}_out": [] for k in RUN_KEYS} | {f"{k}_live": "" for k in RUN_KEYS}
    cleared.update({f"{k}_header": column_header(k) for k in RUN_KEYS})
    yield (cleared | _visible_vanilla(include_vanilla) | banner_update(hub)
           | {"status": "▶ running…" + (f" ({note})" if note else "")})
    run_id = hub.begin_run()
    advance = functools.partial(hub.next_step, run_id)
    for key, method in plan:
        decoder = TokenizerDecoder(runner.tokenizer)
        last = 0.0
        label = method_label(method)
        try:
            for partial, done in stream_run(runner, parse_prompt(prompt), configs[key], advance,
                                            caps.max_prompt_tokens):
                if state.stop_requested:
                    yield {"status": STOPPED}
                    return
                if done:
                    state.put(key, finish_run(partial, decoder))
                    break
                if time.perf_counter() - last < STREAM_INTERVAL_S:
                    continue
                t0 = time.perf_counter()
                update = {f"{key}_out": render.output_spans(partial, decoder, show_rejected),
                          f"{key}_live": "running · " + render.live_line(partial),
                          "status": f"▶ {label}: step {len(partial.steps)}, {len(partial.tokens)} tokens"}
                if teaching and partial.steps:
                    update["live_narration"] = render.narrate(partial, len(partial.steps) - 1, decoder)
                render_ms.append((time.perf_counter() - t0) * 1000)
                last = time.perf_counter()
                yield update
        except RespecError as exc:
            yield _warn(f"{label}: {exc}")
            return
        run = state.runs[key]
        yield {f"{key}_out": render.output_spans(run.result, run.decoder, show_rejected),
               f"{key}_live": render.live_line(run.result)}
    # 4. Everything else, from the finished runs.
    state.selected, state.step = "respec", 0
    out = full_update(state, show_rejected, teaching)
    mean = sum(render_ms) / len(render_ms) if render_ms else 0.0
    state.last_render_ms = render_ms          # measured server time per streamed update (README)
    out["status"] = (f"✔ done — {len(render_ms)} streamed updates, {mean:.1f} ms server render time each"
                     + (f". {note}" if note else ""))
    out["live_narration"] = ""
    yield out


def banner_update(hub: ModelHub) -> dict[str, Any]:
    """Show the replay-mode banner while the model cannot be loaded, hide it otherwise."""
    text = hub.banner()
    return {"banner": _visible(text, bool(text))}


def _visible_vanilla(include: bool) -> dict[str, Any]:
    import gradio as gr
    return {"vanilla_col": gr.update(visible=include)}


# ------------------------------------------------------------------------------- compare (API)
def compare_api(hub: ModelHub, caps: Caps, prompt: str, settings_json: str = "{}"
                ) -> tuple[str, str, str, str, str]:
    """`/compare`: (ReSpec text, EAGLE-2 text, ReSpec trace JSON, EAGLE-2 trace JSON, metrics JSON).
    Raises RespecError (the caller turns it into gr.Error) for bad input."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise PromptError("The prompt is empty: type some text first.")
    caps.check_prompt(prompt)
    flat = parse_settings_json(settings_json)
    _, app = split_app_options(flat)
    device = hub.device()
    plan = plan_methods(bool(app.get("include_vanilla", False)))
    configs = {key: build_config(flat, method, device, caps) for key, method in plan}
    runner = hub.runner()
    results: dict[str, GenerationResult] = {}
    advance = functools.partial(hub.next_step, hub.begin_run())
    for key, _method in plan:
        decoder = TokenizerDecoder(runner.tokenizer)
        for partial, done in stream_run(runner, parse_prompt(prompt), configs[key], advance, caps.max_prompt_tokens):
            if done:
                results[key] = finish_run(partial, decoder).result
    vanilla = results.get("vanilla")
    metrics: dict[str, Any] = {key: render.run_metrics(r, vanilla) for key, r in results.items()}
    a, b = results["respec"], results["eagle"]
    first = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y),
                 None if a.tokens == b.tokens else min(len(a.tokens), len(b.tokens)))
    metrics["comparison"] = {"identical": a.tokens == b.tokens, "first_difference": first,
                             "respec_column_method": a.config.method, "note": fallback_note(),
                             "preset": app.get("preset", "device"),
                             "model": hub._runner_spec or hub.spec, "eagle_head": getattr(runner, "head_info", None)}
    if vanilla is not None:
        metrics["comparison"]["equal_to_vanilla"] = {k: r.tokens == vanilla.tokens for k, r in results.items()}
    return a.text, b.text, result_to_json(a), result_to_json(b), json.dumps(metrics, allow_nan=False, default=_json_default)


def replay_api(trace_json: str) -> tuple[str, str]:
    """`/replay`: check a trace file's text and summarise it: (text, metrics JSON with the method,
    settings and step count). No model is needed. Raises TraceFormatError for a malformed trace."""
    if not isinstance(trace_json, str) or not trace_json.strip():
        raise TraceFormatError("the trace is empty: pass the text of a trace JSON file")
    if len(trace_json.encode("utf-8", errors="surrogatepass")) > MAX_TRACE_BYTES:
        raise TraceFormatError(f"the trace is larger than {MAX_TRACE_BYTES // 2**20} MB")
    result = result_from_json(trace_json)
    metrics = render.run_metrics(result)
    metrics["settings"] = result.config.to_dict()
    metrics["prompt_tokens"] = len(result.prompt_tokens)
    return result.text, json.dumps(metrics, allow_nan=False, default=_json_default)


def _json_default(x):
    return None if isinstance(x, float) and not math.isfinite(x) else str(x)


# ------------------------------------------------------------------------------- traces on disk
def recorded_traces(folder: Path = TRACES_DIR) -> dict[str, dict[str, Path]]:
    """Shipped traces: files `<name>__<column>.json` grouped by name, in name order."""
    out: dict[str, dict[str, Path]] = {}
    for path in sorted(folder.glob("*__*.json")):
        name, _, key = path.stem.rpartition("__")
        if key in RUN_KEYS:
            out.setdefault(name, {})[key] = path
    return out


def recorded_choices(folder: Path = TRACES_DIR) -> list[tuple[str, str]]:
    choices = []
    for name, files in recorded_traces(folder).items():
        label = name.replace("-", " ")
        try:
            head = json.loads(next(iter(files.values())).read_text(encoding="utf-8"))
            prompt = (head.get("meta") or {}).get("prompt")
            if isinstance(prompt, str):
                label = prompt if len(prompt) <= 70 else prompt[:69] + "…"
        except (OSError, ValueError):
            pass
        choices.append((label, name))
    return choices


def load_trace_text(text: str | bytes, origin: str, tokenizer=None) -> tuple[str, Run]:
    """Parse one trace file -> (column, Run). Raises TraceFormatError."""
    result = result_from_json(text)
    decoder = render.decoder_for(result, tokenizer)
    if isinstance(decoder, TokenizerDecoder):            # no embedded table: freeze one now
        table = render.text_table(result, decoder)
        decoder = TableDecoder(result.tokens, table["pieces"], table["vocab"])
    return run_key_for(result.config.method), Run(result=result, decoder=decoder, origin=origin)


def open_recorded(hub: ModelHub, name: str, show_rejected: bool, teaching: bool, state: SessionState
                  ) -> dict[str, Any]:
    """Open a shipped pair of traces (replay, no model)."""
    state = state if isinstance(state, SessionState) else SessionState()
    files = recorded_traces().get(name)
    if not files:
        return _warn(f"No recorded trace named {name!r}.") | {"state": state}
    runs = []
    try:
        for key, path in files.items():
            runs.append(load_trace_text(path.read_bytes(), path.name, hub.tokenizer))
    except (OSError, TraceFormatError) as exc:
        return _warn(f"Could not open the recorded trace: {exc}") | {"state": state}
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
        try:
            if path.stat().st_size > MAX_TRACE_BYTES:
                raise TraceFormatError(f"{path.name} is larger than {MAX_TRACE_BYTES // 2**20} MB")
            runs.append(load_trace_text(path.read_bytes(), _origin_name(path.name), hub.tokenizer))
        except (OSError, TraceFormatError) as exc:
            return _warn(f"Could not read {_origin_name(path.name)}: {exc}") | {"state": state}
    return _replace_runs(state, runs, show_rejected, teaching,
                         f"Replaying {len(runs)} uploaded trace file(s) (no model needed)")


def _origin_name(name: str) -> str:
    return re.sub(r"[^\w.\-]+", "_", os.path.basename(name))[:80] or "upload.json"


def _replace_runs(state: SessionState, runs: list[tuple[str, Run]], show_rejected: bool, teaching: bool,
                  status: str) -> dict[str, Any]:
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
    if key in state.runs:
        state.selected = key
        state.step = 0
    out = explorer_update(state, teaching)
    out.update(downloads_update(state))
    return out


def select_step(step: float, teaching: bool, state: SessionState) -> dict[str, Any]:
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
    import gradio as gr
    run = state.current()
    start = playing_label.startswith("▶")
    if start and run is not None and run.result.steps and state.step >= len(run.result.steps) - 1:
        state.step = -1                                   # replay from the start
    return {"timer": gr.Timer(active=start), "play": gr.update(value="❚❚ pause" if start else "▶ play")}


def rerender_outputs(show_rejected: bool, state: SessionState) -> dict[str, Any]:
    return outputs_update(state, show_rejected)


def rerender_narration(teaching: bool, state: SessionState) -> dict[str, Any]:
    run = state.current()
    if run is None or not run.result.steps:
        return {"narration": ""}
    return {"narration": render.narrate(run.result, state.step, run.decoder) if teaching else ""}


def example_prompts(folder: Path = PROMPTS_DIR) -> list[str]:
    """Example prompts, one per file in assets/prompts (*.txt), in file-name order."""
    out = []
    for path in sorted(folder.glob("*.txt")):
        text = path.read_text(encoding="utf-8").strip()
        if text:
            out.append(text)
    return out
