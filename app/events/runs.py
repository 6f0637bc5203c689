"""One method's run, streamed: engine steps -> partial `GenerationResult`s -> a finished `Run`.

Contract: `stream_run(runner, prompt, config, advance)` yields (partial result, False) after every
target forward and finally (complete result with metadata, True); `advance` pulls one step (the
app passes `ModelHub.next_step`, so a superseded run stops). `finish_run` embeds the text table in
the trace so replay needs no tokenizer. `plan_methods` is the column order every compare follows
(page, API, recorded traces); `parse_prompt` reads a prompt box that may hold a JSON chat. No
Gradio; the only state is the engine's.

Timing: a run's `wall_time_s` is the time spent inside the engine (prefill + steps); the time the
page spends rendering between steps is excluded, so tokens/s are comparable between methods.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Callable, Iterator, Sequence

from app.session.settings import COLUMN_METHODS
from app.session.state import Run
from app.views.decoders import TableDecoder, text_table
from respec.trace import GenerationResult, validate_result


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
