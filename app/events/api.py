"""The HTTP API's work: `/compare` and `/replay` as plain functions (ui.py registers them with
`gr.api` and turns a `RespecError` into `gr.Error`; `/history` lives in app/events/tuning.py).

Contract: `compare_api(hub, caps, prompt, settings_json)` validates the prompt and settings before
touching the model, runs the compare plan (ReSpec, EAGLE-2, and vanilla with
`"include_vanilla": true`) through the same streamed path as the page, and returns five strings:
(ReSpec text, EAGLE-2 text, ReSpec trace JSON, EAGLE-2 trace JSON, metrics JSON). The metrics JSON
holds `render.run_metrics` per column and a "comparison" block (identical, first difference, the
ReSpec column's method, preset, model, EAGLE head, and equality with vanilla when it ran).
`replay_api(trace_json)` checks a trace and summarises it without a model. Both raise
`RespecError` for bad input.
"""
from __future__ import annotations

import functools
import json
import math
from typing import Any

from app.events.runs import finish_run, parse_prompt, plan_methods, stream_run
from app.session.hub import ModelHub
from app.session.settings import COLUMN_A_KEY, Caps, build_config, parse_settings_json, split_app_options
from app.session.traces import MAX_TRACE_BYTES
from app.views import render
from app.views.decoders import TokenizerDecoder
from respec.errors import PromptError, TraceFormatError
from respec.trace import GenerationResult, result_from_json, result_to_json


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
    plan = plan_methods(bool(app.get("include_vanilla", False)), app.get(COLUMN_A_KEY, "respec"))
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
    metrics["comparison"] = {"identical": a.tokens == b.tokens,
                             "first_difference": render.first_difference(a.tokens, b.tokens),
                             "respec_column_method": a.config.method, "preset": app.get("preset", "device"),
                             "model": hub.current_spec, "eagle_head": getattr(runner, "head_info", None)}
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
    """json.dumps' fallback for values JSON has no type for: their text (a non-finite float: null)."""
    return None if isinstance(x, float) and not math.isfinite(x) else str(x)
