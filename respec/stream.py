"""One run of the engine as a single object: its steps as they come, the result so far, the result.

Contract: `RunStream(engine, prompt_ids, finish)` is an iterator of the engine's `StepTrace`s (one
per target forward after the prefill, `Engine.stream`). At any point `partial()` is the
`GenerationResult` of the steps pulled so far (stop reason "running", no text; an empty result
before the first step); once the iterator is exhausted `result` is the finished `GenerationResult`
(stop reason, decoded text), and `finish(result)` has run once (`Runner.stream` passes one that adds
the metadata `Runner.generate` gives and records the answer in the runner's memory). `close()` stops
a run midway (the engine's generator is closed; `result` stays None).

Timing: `wall_time_s` counts the time spent inside the engine's `next` only (prefill + steps), so
whatever the consumer does between two steps (rendering a page, waiting for a lock) is excluded
and tokens/s compare between methods. Callers use this object, never `Engine.prefill` /
`Engine.assemble`. Nothing at import.
"""
from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Callable, Sequence

from respec.trace import GenerationResult, StepTrace

if TYPE_CHECKING:
    from respec.engine import Engine


class RunStream:
    """A run, step by step: `for step in stream`, `stream.partial()`, then `stream.result`."""

    def __init__(self, engine: Engine, prompt_ids: Sequence[int],
                 finish: Callable[[GenerationResult], None] | None = None) -> None:
        self.engine = engine
        self.prompt_ids: tuple[int, ...] = tuple(int(t) for t in prompt_ids)
        self._finish = finish
        self._steps_iter = engine.stream(self.prompt_ids)   # a generator: nothing runs until the first next
        self._steps: list[StepTrace] = []
        self._engine_s = 0.0
        self.result: GenerationResult | None = None      # set once the run has ended (never after close())
        self._closed = False

    def __iter__(self) -> RunStream:
        return self

    def __next__(self) -> StepTrace:
        """The next step; StopIteration at the end, after `result` is set and `finish` has run."""
        if self._closed:
            raise StopIteration
        t0 = time.perf_counter()
        try:
            step = next(self._steps_iter)
        except StopIteration:
            self._engine_s += time.perf_counter() - t0
            self._end()
            raise
        self._engine_s += time.perf_counter() - t0
        self._steps.append(step)
        return step

    def _end(self) -> None:
        if self.result is not None:
            return
        result = self.engine.assemble(self.prompt_ids, self._steps, self._engine_s, final=True)
        if self._finish is not None:
            self._finish(result)
        self.result = result

    @property
    def steps(self) -> tuple[StepTrace, ...]:
        """The steps pulled so far."""
        return tuple(self._steps)

    @property
    def wall_time_s(self) -> float:
        """Seconds spent inside the engine so far (prefill + steps)."""
        return self._engine_s

    @property
    def done(self) -> bool:
        """Whether the run has ended (and `result` is set)."""
        return self.result is not None

    def partial(self) -> GenerationResult:
        """The GenerationResult of the steps so far (the same accounting as `Engine.generate`:
        [first token] + every step's new tokens, cut at max_new_tokens and after a stop token),
        stop reason "running" and no text; the finished result once the run has ended. Before the
        prefill: no tokens, no steps."""
        if self.result is not None:
            return self.result
        if self.engine.prefill is None:
            return GenerationResult(prompt_tokens=self.prompt_ids, tokens=(), text="", first_entropy=math.nan,
                                    first_margin=math.nan, steps=tuple(self._steps), config=self.engine.config,
                                    wall_time_s=self._engine_s, prefill_ms=0.0, stop_reason="running", meta={})
        return self.engine.assemble(self.prompt_ids, self._steps, self._engine_s, final=False)

    def close(self) -> None:
        """Stop the run where it is (closes the engine's generator): no more steps, and a run not
        yet ended never gets a `result` nor runs `finish`. Safe to call more than once."""
        self._closed = True
        self._steps_iter.close()
