"""`Runner.stream` returns one object, a `RunStream`: iterating it yields the engine's steps, `partial()`
is the result so far at any step, and `result` after the end is what `Runner.generate` gives (same
tokens, text, trace and metadata keys); the answer joins the runner's memory only for a run streamed to
its end. Tiny fp64 models on CPU: exact."""
from __future__ import annotations

import functools

import pytest

from respec.runner import Runner
from respec.stream import RunStream
from respec.trace import result_to_dict
from tests.test_app_render import REPEAT, word_tokenizer
from tests.conftest import make_target

TIMED = ("wall_time_s", "prefill_ms", "stats")


@functools.lru_cache(maxsize=None)
def _target():
    target = make_target("llama", seed=3)
    target.tokenizer = word_tokenizer()
    return target


def fresh_runner() -> Runner:
    """A runner of its own (its own answer memory) over the shared tiny target."""
    return Runner(_target())


def comparable(result) -> dict:
    d = result_to_dict(result)
    for s in d["steps"]:
        s.pop("draft_ms"), s.pop("verify_ms"), s.pop("at_ms")
    for key in TIMED:
        d.pop(key)
    return d


@pytest.mark.parametrize("method", ["vanilla", "eagle2", "respec"])
def test_a_streamed_run_ends_in_what_generate_gives(method):
    runner_a, runner_b = fresh_runner(), fresh_runner()
    config = runner_a.config(method=method, max_new_tokens=20, auto=False, theta_H=20.0)
    ref = runner_a.generate(REPEAT, config)
    stream = runner_b.stream(REPEAT, config)
    assert isinstance(stream, RunStream)
    steps = list(stream)
    assert stream.done and stream.result is not None
    got = stream.result
    assert steps == list(got.steps), "Iterating yields exactly the steps of the finished result."
    assert got.tokens == ref.tokens and got.text == ref.text and got.stop_reason == ref.stop_reason
    assert comparable(got) == comparable(ref), f"{method}: the streamed trace must equal generate's."
    assert set(got.meta) == set(ref.meta) and got.meta["method"] == method, \
        "The finished result carries the metadata Runner.generate gives."
    assert got.wall_time_s > 0 and got.wall_time_s == stream.wall_time_s
    assert len(runner_b.memory.answers) == len(runner_a.memory.answers) > 0, \
        "A run streamed to its end joins the earlier answers, like generate's."


def test_partial_follows_every_step():
    runner = fresh_runner()
    stream = runner.stream(REPEAT, runner.config(method="eagle2", max_new_tokens=16, auto=False))
    before = stream.partial()
    assert before.tokens == () and before.steps == () and before.stop_reason == "running", \
        "Before the first step (and the prefill) the partial result is empty."
    lengths = []
    for step in stream:
        partial = stream.partial()
        assert partial.steps[-1] is step and partial.stop_reason == "running" and partial.text == ""
        lengths.append(len(partial.tokens))
    assert lengths == sorted(lengths) and lengths[-1] <= len(stream.result.tokens)
    assert stream.partial() is stream.result, "After the end, partial() is the finished result."
    with pytest.raises(StopIteration):
        next(stream)


def test_a_closed_stream_has_no_result_and_leaves_no_answer():
    runner = fresh_runner()
    stream = runner.stream(REPEAT, runner.config(method="eagle2", max_new_tokens=20, auto=False))
    next(stream), next(stream)
    stream.close()                                     # Stop / a superseded run
    assert stream.result is None and not stream.done and len(stream.steps) == 2
    assert len(runner.memory.answers) == 0, "Only a run streamed to its end joins the earlier answers."
    assert stream.partial().stop_reason == "running"
    with pytest.raises(StopIteration):
        next(stream)
    assert stream.result is None and len(runner.memory.answers) == 0, "A closed stream never finishes."
