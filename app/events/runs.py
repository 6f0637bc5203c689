"""One method's run, streamed: engine steps -> partial `GenerationResult`s -> a finished `Run`.

Contract: `stream_run(runner, prompt, config, advance)` yields (partial result, False) after every
target forward and finally (complete result with metadata, True), all read off the runner's
`RunStream` (respec/stream.py; app/ never calls into the Engine); `advance` pulls one step (the
app passes `ModelHub.next_step`, so a superseded run stops). `finish_run` embeds the text table in
the trace so replay needs no tokenizer. `plan_methods` is the column order every compare follows
(page, API, recorded traces); `parse_prompt` reads a prompt box that may hold a JSON chat. No
Gradio; the only state is the stream's.

Timing: a run's `wall_time_s` is the time spent inside the engine (prefill + steps, as the stream
counts it); the time the page spends rendering between steps (or waiting for the model's step lock)
is excluded, so tokens/s are comparable between methods.
"""
from __future__ import annotations

import json
from typing import Callable, Iterator

from app.session.settings import COLUMN_METHODS
from app.session.state import Run
from app.views.decoders import TableDecoder, text_table
from respec.trace import GenerationResult, validate_result


# ------------------------------------------------------------------------------- one run, streamed
def stream_run(runner, prompt: str, config, advance: Callable | None = None, max_prompt_tokens: int | None = None
               ) -> Iterator[tuple[GenerationResult, bool]]:
    """Run one method, yielding (partial result, False) after every target forward and finally
    (complete result with metadata, True). `advance(stream)` pulls one step (default: next; the app
    passes ModelHub.next_step). Raises RespecError for a bad prompt."""
    advance = advance or next
    stream = runner.stream(prompt, config, max_prompt_tokens=max_prompt_tokens)   # respec.stream.RunStream
    try:
        while True:
            try:
                advance(stream)
            except StopIteration:
                break
            yield stream.partial(), False
    finally:
        stream.close()
    result = stream.result
    validate_result(result)
    result.meta["engine_time"] = "prefill + steps; UI rendering excluded"
    # The target's verify-cost curve, if tree.auto already measured it (never measured here: it costs
    # ~30 forwards); it grounds the estimated speedup when vanilla was not run.
    measured = getattr(runner.target, "measured_curve", None)
    curve = measured() if callable(measured) else None
    if isinstance(curve, dict) and curve:
        result.meta["verify_cost_ms"] = {str(k): round(float(v), 3) for k, v in curve.items()}
    yield result, True


def finish_run(result: GenerationResult, decoder) -> Run:
    """Embed the text table in the trace (replay needs no tokenizer) and wrap it as a Run."""
    table = text_table(result, decoder)
    result.meta["display"] = table
    return Run(result=result, decoder=TableDecoder.from_table(result.tokens, table))


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


def plan_methods(include_vanilla: bool, column_a: str = "respec") -> list[tuple[str, str]]:
    """(column, method) in run order: ReSpec (or the left column's `column_a` method), EAGLE-2,
    optionally vanilla."""
    return [(key, column_a if key == "respec" else method) for key, method in COLUMN_METHODS.items()
            if include_vanilla or key != "vanilla"]
