"""Trace JSON round trip, trace invariants, and rejection of malformed or inconsistent trace files."""
import json

import pytest

from respec.errors import TraceFormatError
from respec.trace import SCHEMA_VERSION, result_from_json, result_to_json
from tests.conftest import make_target, run


@pytest.fixture(scope="module")
def result():
    target = make_target("llama")
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]
    r = run(target, "sam", prompt, max_new_tokens=30, **{"sam.len_threshold": 2})
    r.meta.update(model="tiny-llama", prompt="ids")
    return r


def test_round_trip_is_exact(result):
    again = result_from_json(result_to_json(result))
    assert again == result, "Exporting and importing a trace must give an equal result."
    assert result_to_json(again) == result_to_json(result)


def test_invariants(result):
    st = result.stats
    assert sum(len(s.new_tokens) for s in result.steps) + 1 >= len(result.tokens)
    for s in result.steps:
        assert len(s.new_tokens) == s.num_accepted + 1, "Each step emits accepted tokens plus one bonus."
    assert sum(st.accept_length_hist) == st.steps, "Histogram counts must sum to the number of steps."
    assert st.mean_accepted_length == pytest.approx(1 + st.accepted_tokens / st.steps), \
        "Mean accepted length counts the bonus token."
    assert len(result.token_entropies()) == len(result.tokens) == len(result.token_sources())


def test_steps_carry_when_they_were_reported(result):
    """at_ms: ms from the run's start, after the prefill and never decreasing; a trace written
    before the field existed loads with 0."""
    times = [s.at_ms for s in result.steps]
    assert times[0] >= result.prefill_ms and times == sorted(times)
    assert times[-1] <= result.wall_time_s * 1000
    d = json.loads(result_to_json(result))
    for step in d["steps"]:
        step.pop("at_ms")
    assert all(s.at_ms == 0.0 for s in result_from_json(json.dumps(d)).steps)


def _mutate(result, fn):
    d = json.loads(result_to_json(result))
    fn(d)
    return json.dumps(d)


@pytest.mark.parametrize("name,fn", [
    ("future version", lambda d: d.update(version=SCHEMA_VERSION + 1)),
    ("foreign schema", lambda d: d.update(schema="something-else")),
    ("parent out of range", lambda d: d["steps"][0]["tree"]["parents"].__setitem__(-1, 99)),
    ("counts do not add up", lambda d: d["tokens"].extend([1, 2, 3])),
    ("path not in tree", lambda d: d["steps"][0]["verdict"].update(path=[0, 5, 1])),
    ("new tokens inconsistent", lambda d: d["steps"][0].update(new_tokens=[1, 2, 3, 4, 5, 6])),
    ("bad settings", lambda d: d["config"].update(max_new_tokens=-4)),
    ("missing field", lambda d: d.pop("steps")),
    ("negative time", lambda d: d.update(wall_time_s=-1.0)),
    ("negative step time", lambda d: d["steps"][0].update(at_ms=-1.0)),
])
def test_inconsistent_traces_are_rejected(result, name, fn):
    with pytest.raises(TraceFormatError):
        result_from_json(_mutate(result, fn))


@pytest.mark.parametrize("text", ["", "{", "[]", "null", "\x00\xff", json.dumps({"schema": "respec-trace"})])
def test_malformed_files_are_rejected(text):
    with pytest.raises(TraceFormatError):
        result_from_json(text)


def test_truncated_file_is_rejected(result):
    text = result_to_json(result)
    with pytest.raises(TraceFormatError):
        result_from_json(text[: len(text) // 2])


def test_node_ranks_and_probs_agree_with_strict_verification(result):
    for s in result.steps:
        assert len(s.node_ranks) == len(s.node_probs) == s.tree.size
        for node in s.verdict.path[1:]:
            assert s.node_ranks[node] == 1, "A strictly accepted draft token is the target's top-1."
        for node, st in enumerate(s.verdict.node_status):
            if st == "rejected":
                assert s.node_ranks[node] > 1
        assert all(0.0 <= p <= 1.0 for p in s.node_probs)
