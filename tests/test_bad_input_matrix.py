"""The bad-input matrix (reliability issue): every kind of bad input, through the Python API, the
CLI and gradio_client, gets one clear message of ours, never a traceback, and the next request
works. Settings come from `respec.config.setting_ranges()`, so a new setting joins the matrix by
being declared.

Kinds: prompts (empty, whitespace, 100k characters, lone surrogates / undecodable bytes, not text);
every numeric setting at, below and above its range, NaN, infinity, strings and lists where numbers
belong, None where "off" is not allowed; unknown methods, settings and models; trace files that are
empty, truncated, binary, from a future version, or hand-edited to be inconsistent."""
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import copy  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from respec.config import EngineConfig, setting_ranges  # noqa: E402
from respec.errors import ConfigError, ModelLoadError, PromptError, RespecError, TraceFormatError  # noqa: E402
from respec.trace import result_from_json  # noqa: E402
from tests.test_app_client import client  # noqa: E402,F401 - the tiny-model app behind gradio_client

ROOT = Path(__file__).resolve().parent.parent
GOOD_TRACE = (ROOT / "assets" / "traces" / "days-of-the-week__eagle.json").read_text(encoding="utf-8")
RANGES = setting_ranges()


# ------------------------------------------------------------------------------- the cases
def _below(r):
    return r.lo - 1 if r.integer else r.lo - max(1e-3, abs(r.lo) * 0.01)


def _above(r):
    return r.hi + 1 if r.integer else r.hi + max(1e-3, abs(r.hi) * 0.01)


#: (setting, value, words the message must contain) for every numeric setting.
BAD_SETTINGS = [case for key, r in RANGES.items() for case in (
    (key, _below(r), "must be in"),
    (key, _above(r), "must be in"),
    (key, math.nan, "finite"),
    (key, math.inf, "finite"),
    (key, "lots", "must be a number"),
    (key, [1], "must be a number"),
    (key, True, "must be a number"),
) + (() if r.allow_none else ((key, None, "must be set"),))]


def _field(key: str) -> str:
    return key.rpartition(".")[2]


def _edit(fn):
    d = json.loads(GOOD_TRACE)
    fn(d)
    return json.dumps(d)


def _set(path, value):
    def fn(d):
        obj = d
        for p in path[:-1]:
            obj = obj[p]
        obj[path[-1]] = value
    return fn


#: (name, trace file content, words the message must contain)
BAD_TRACES = [
    ("empty", "", "not valid JSON"),
    ("whitespace", "  \n ", "not valid JSON"),
    ("truncated", GOOD_TRACE[: len(GOOD_TRACE) // 2], "not valid JSON"),
    ("binary", b"\xff\xfe\x00\x9c\x80garbage", "not valid JSON"),
    ("a JSON list", "[1, 2, 3]", "must be a JSON object"),
    ("another schema", _edit(_set(["schema"], "something-else")), "not a ReSpec trace"),
    ("future version", _edit(_set(["version"], 99)), "unsupported trace version 99"),
    ("missing steps", _edit(lambda d: d.pop("steps")), "malformed trace"),
    ("parent out of range", _edit(_set(["steps", 0, "tree", "parents", 1], 99)), "parent"),
    ("path not in the tree", _edit(_set(["steps", 0, "verdict", "path"], [0, 7])), "not a path of the tree"),
    ("node status count", _edit(lambda d: d["steps"][0]["verdict"]["node_status"].pop()), "node_status"),
    ("step numbering", _edit(_set(["steps", 3, "step"], 9)), "numbered"),
    ("token changed", _edit(_set(["tokens", 5], 7)), "generated token 5"),
    ("token added", _edit(lambda d: d["tokens"].append(7)), "add up"),
    ("negative token id", _edit(_set(["prompt_tokens", 0], -4)), "negative token id"),
    ("stats new_tokens", _edit(_set(["stats", "new_tokens"], 65)), "stats.new_tokens"),
    ("stats steps", _edit(_set(["stats", "steps"], 3)), "stats.steps"),
    ("stats histogram", _edit(_set(["stats", "accept_length_hist"], [1, 2])), "stats.accept_length_hist"),
    ("unknown source", _edit(_set(["steps", 0, "source"], "magic")), "unknown draft source"),
    ("bad settings inside", _edit(_set(["config", "max_new_tokens"], -1)), "invalid settings"),
    ("text not a string", _edit(_set(["text"], 5)), "text must be a string"),
]

LONG = "word " * 20_000                       # 100k characters

#: (name, prompt, words the message must contain) for the Python API
BAD_PROMPTS = [
    ("empty", "", "empty"),
    ("whitespace", " \n\t  ", "empty"),
    ("lone surrogate", "abc \ud800 def", "not valid Unicode"),
    ("undecodable bytes (surrogateescape)", b"caf\xe9 \xff".decode("utf-8", "surrogateescape"), "not valid Unicode"),
    ("bytes", b"\xff\xfe", "not bytes"),
    ("a number", 12, "not int"),
    ("None", None, "not NoneType"),
    ("chat without content", [{"role": "user"}], "'content'"),
    ("empty chat", [], "empty"),
]


def test_the_matrix_covers_every_setting():
    assert len(RANGES) >= 25 and "trigger.theta_entropy" in RANGES and "max_new_tokens" in RANGES
    assert {k for k, _, _ in BAD_SETTINGS} == set(RANGES)


# ------------------------------------------------------------------------------- Python API
@pytest.mark.parametrize("key", sorted(RANGES))
def test_every_setting_is_accepted_at_both_ends_of_its_range(key):
    r = RANGES[key]
    for value in (r.lo, r.hi):
        cfg = EngineConfig().with_overrides({key: value})
        section, _, name = key.rpartition(".")
        got = getattr(getattr(cfg, section) if section else cfg, name)
        assert got == value, f"{key}={value} is inside its range {r.text()} and must be kept"
    if r.allow_none:
        EngineConfig().with_overrides({key: None})


@pytest.mark.parametrize("key,value,needle", BAD_SETTINGS, ids=[f"{k}={v!r}" for k, v, _ in BAD_SETTINGS])
def test_bad_setting_values_are_refused_naming_the_setting(key, value, needle):
    with pytest.raises(ConfigError) as err:
        EngineConfig().with_overrides({key: value})
    msg = str(err.value)
    assert needle in msg and _field(key) in msg, f"the message must name {key} and say what is wrong: {msg}"


@pytest.mark.parametrize("overrides,needle", [
    ({"method": "medusa"}, "unknown method"), ({"method": ""}, "unknown method"), ({"method": None}, "unknown method"),
    ({"tree.nonsense": 1}, "unknown setting"), ({"nonsense": 1}, "unknown setting"), ({"": 1}, "unknown setting"),
    ({"tree.auto": "maybe"}, "must be a number"), ({"tree.auto": 2}, "true or false"),
])
def test_unknown_methods_and_settings_are_refused(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        EngineConfig().with_overrides(overrides)


@pytest.fixture(scope="module")
def runner():
    from tests.test_app_render import tiny_runner
    return tiny_runner()


@pytest.mark.parametrize("name,prompt,needle", BAD_PROMPTS, ids=[c[0] for c in BAD_PROMPTS])
def test_bad_prompts_are_refused_and_the_runner_keeps_working(runner, name, prompt, needle):
    cfg = runner.config({"method": "sam", "max_new_tokens": 6, "sam.len_threshold": 2})
    with pytest.raises(PromptError) as err:
        runner.generate(prompt, cfg)
    assert needle in str(err.value), f"{name}: {err.value}"
    assert len(runner.generate("w5 w6 w7 w5 w6", cfg).tokens) == 6, "the next request works"


def test_a_100k_character_prompt_is_refused_by_the_context_and_by_a_deployment_cap(runner):
    cfg = runner.config({"method": "eagle2", "max_new_tokens": 4})
    with pytest.raises(PromptError, match="context"):
        runner.generate(LONG, cfg)
    with pytest.raises(PromptError, match="at most 50"):
        runner.encode("w5 " * 60, max_tokens=50)
    from app.session.settings import Caps
    caps = Caps(max_new_tokens=64, default_new_tokens=24, max_tree_tokens=64, time_limit_s=60, queue_size=4)
    with pytest.raises(PromptError, match="RESPEC_MAX_PROMPT_CHARS"):
        caps.check_prompt(LONG)
    with pytest.raises(PromptError, match="RESPEC_MAX_PROMPT_CHARS"):
        caps.check_prompt([{"role": "user", "content": LONG}])
    caps.check_prompt("w5 w6")


def test_prompts_with_odd_but_valid_text_run(runner):
    cfg = runner.config({"method": "eagle2", "max_new_tokens": 4})
    for prompt in ("a\x00b\x01c", "héllo 🙂 مرحبا \u202e", "\ufffd\ufffd w5"):
        assert len(runner.generate(prompt, cfg).tokens) == 4


@pytest.mark.parametrize("spec", ["no-such-org/no-such-model-xyz", "/nonexistent/model-dir", "model.gguf"])
def test_unknown_models_raise_a_load_error_naming_them(spec):
    from respec.models import load_target
    with pytest.raises(ModelLoadError) as err:
        load_target(spec)
    assert spec.split("/")[-1] in str(err.value)


@pytest.mark.parametrize("name,text,needle", BAD_TRACES, ids=[c[0] for c in BAD_TRACES])
def test_bad_trace_files_are_refused_saying_what_is_wrong(name, text, needle):
    with pytest.raises(TraceFormatError) as err:
        result_from_json(text)
    assert needle in str(err.value), f"{name}: {err.value}"


def test_the_unedited_trace_loads():
    assert result_from_json(GOOD_TRACE).stats.new_tokens > 0


# ------------------------------------------------------------------------------- CLI
def _cli(capsys, *argv):
    """`python -m respec ...` in this process: (exit status, stderr)."""
    from respec.cli import main
    code = main(list(argv))
    return code, capsys.readouterr().err


CLI_SETTINGS = [(k, v, n) for k, v, n in BAD_SETTINGS if not isinstance(v, (list, bool)) and v is not None]


@pytest.mark.parametrize("key,value,needle", CLI_SETTINGS, ids=[f"{k}={v!r}" for k, v, _ in CLI_SETTINGS])
def test_cli_refuses_bad_settings_before_loading_a_model(capsys, tmp_path, key, value, needle):
    code, err = _cli(capsys, "generate", "--prompt", "hi", "--model", "/nonexistent/never-loaded",
                     "--set", f"{key}={value}", "--trace", str(tmp_path / "t.json"))
    assert code == 2 and needle in err and "Traceback" not in err and "never-loaded" not in err, err
    assert err.strip().count("\n") == 0, f"one line: {err!r}"
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("name,prompt,needle", [c for c in BAD_PROMPTS if isinstance(c[1], str)],
                         ids=[c[0] for c in BAD_PROMPTS if isinstance(c[1], str)])
def test_cli_refuses_bad_prompts_before_loading_a_model(capsys, name, prompt, needle):
    code, err = _cli(capsys, "generate", "--prompt", prompt, "--model", "/nonexistent/never-loaded")
    assert code == 2 and needle in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv,needle", [
    (["generate", "--prompt", "hi", "--method", "medusa"], "unknown method"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "max_new_tokens"),
    (["generate", "--prompt", "hi", "--set", "nonsense=1"], "unknown setting"),
    (["generate", "--prompt", "hi", "--set", "theta_H"], "key=value"),
    (["generate", "--prompt", "hi", "--model", "/nonexistent/model-dir"], "/nonexistent/model-dir"),
    (["generate", "--prompt", "hi", "--model", "no-such-org/no-such-model-xyz"], "no-such-model-xyz"),
    (["bench", "--questions", "/nonexistent.jsonl", "--out", "OUT"], "not found"),
    (["bench", "--questions", "QFILE", "--methods", "vanilla,nope", "--out", "OUT"], "unknown method"),
    (["bench", "--questions", "QFILE", "--limit-per-category", "0", "--out", "OUT"], "limit-per-category"),
    (["replay", "/nonexistent/trace.json"], "cannot read trace"),
])
def test_cli_refuses_bad_arguments_leaving_nothing_behind(capsys, tmp_path, argv, needle):
    qfile = tmp_path / "q.jsonl"
    qfile.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["hi"]}) + "\n")
    argv = [str(tmp_path / "out") if a == "OUT" else str(qfile) if a == "QFILE" else a for a in argv]
    code, err = _cli(capsys, *argv)
    assert code == 2 and needle in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists(), "a failed run leaves no output behind"


@pytest.mark.parametrize("name,text,needle", BAD_TRACES, ids=[c[0] for c in BAD_TRACES])
def test_cli_replay_refuses_bad_trace_files(capsys, tmp_path, name, text, needle):
    path = tmp_path / "trace.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    code, err = _cli(capsys, "replay", str(path))
    assert code == 2 and needle in err and "Traceback" not in err, err


def test_cli_replays_the_good_trace(capsys, tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(GOOD_TRACE, encoding="utf-8")
    from respec.cli import main
    assert main(["replay", str(path)]) == 0
    assert "mean accepted length" in capsys.readouterr().out


# ------------------------------------------------------------------------------- gradio_client
def _app_error(client, *args, api_name):
    from gradio_client.exceptions import AppError
    with pytest.raises(AppError) as err:
        client.predict(*args, api_name=api_name)
    msg = str(err.value)
    assert "Traceback" not in msg and 'File "' not in msg, msg
    return msg


def _still_serves(client):
    from tests.test_app_render import REPEAT
    a, b, *_ = client.predict(REPEAT, '{"max_new_tokens": 4}', api_name="/compare")
    assert a.strip() and b.strip(), "after the error the app still answers"


def test_api_refuses_every_bad_setting(client):
    """All settings cases in one test (one server): each a clear error naming the setting."""
    for key, value, needle in BAD_SETTINGS:
        if isinstance(value, float) and not math.isfinite(value):
            payload = '{"%s": %s}' % (key, "NaN" if math.isnan(value) else "Infinity")   # what JSON.parse-lax clients send
        else:
            payload = json.dumps({key: value})
        msg = _app_error(client, "w5 w6 w7", payload, api_name="/compare")
        ok = needle in msg or (needle == "must be in" and "cap of" in msg)   # or the deployment's lower cap
        assert ok and _field(key) in msg, f"{key}={value!r}: {msg}"
    _still_serves(client)


@pytest.mark.parametrize("prompt,needle", [
    ("", "empty"), (" \n\t ", "empty"), (LONG, "RESPEC_MAX_PROMPT_CHARS"), ("w5 " * 300, "context"),
    ('[{"role": "user", "content": "  "}]', "empty"),
])
def test_api_refuses_bad_prompts_and_keeps_serving(client, prompt, needle):
    msg = _app_error(client, prompt, "{}", api_name="/compare")
    assert needle in msg, msg
    _still_serves(client)


def test_api_refuses_a_lone_surrogate_sent_as_raw_json(client):
    """gradio_client cannot even encode a lone surrogate, but any HTTP client can send the JSON
    escape "\\ud800"; Gradio's REST route (POST /gradio_api/call/compare, then its event stream)."""
    import httpx
    base = client.src.rstrip("/") + "/gradio_api/call/compare"
    body = json.dumps({"data": ["abc \ud800 def", "{}"]})          # ensure_ascii writes the escape
    event = httpx.post(base, content=body, headers={"content-type": "application/json"}, timeout=30).json()["event_id"]
    stream = httpx.get(f"{base}/{event}", timeout=60).text
    assert "event: error" in stream and "not valid Unicode" in stream and "Traceback" not in stream, stream
    _still_serves(client)


@pytest.mark.parametrize("settings,needle", [
    ('{"method": "medusa"}', "cannot choose the method"), ('{"tree": {"nonsense": 1}}', "unknown setting"),
    ("not json", "not valid JSON"), ("[1]", "must be a JSON object"), ('{"include_vanilla": "perhaps"}', "true or false"),
])
def test_api_refuses_unknown_settings(client, settings, needle):
    assert needle in _app_error(client, "w5 w6", settings, api_name="/compare")


def test_api_replay_refuses_every_bad_trace_and_replays_a_good_one(client):
    for name, text, needle in BAD_TRACES:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")   # what a client can send as a string
            needle = "not valid JSON"
        msg = _app_error(client, text, api_name="/replay")
        assert needle in msg or (name in ("empty", "whitespace") and "the trace is empty" in msg), f"{name}: {msg}"
    text, metrics = client.predict(GOOD_TRACE, api_name="/replay")
    assert text == json.loads(GOOD_TRACE)["text"] and json.loads(metrics)["new_tokens"] == 64
    _still_serves(client)


# ------------------------------------------------------------------------------- a model that fails to load
class _Broken:
    def __init__(self, exc):
        self.exc, self.calls = exc, 0

    def __call__(self, spec):
        self.calls += 1
        raise self.exc


@pytest.mark.parametrize("exc", [OSError("No space left on device"), ModelLoadError("cannot read weights of tiny"),
                                 RuntimeError("CUDA out of memory")])
def test_a_model_that_fails_to_load_leaves_replay_mode_with_a_banner(exc):
    from app.events import api, handlers
    from app.session import traces
    from app.session.hub import ModelHub
    from app.session.state import SessionState
    from tests.test_app_render import CAPS, REPEAT
    hub = ModelHub("tiny", factory=_Broken(exc), choices=["tiny"])
    state = SessionState()
    updates = list(handlers.compare_stream(hub, CAPS, REPEAT, {}, False, False, False, state))
    last = updates[-1]
    assert "Could not load the model" in last["status"] and str(exc).split(":")[0] in last["status"]
    banner = last["banner"]
    assert banner["visible"] and "replay mode" in banner["value"] and "could not be loaded" in banner["value"]
    assert not state.running, "the tab can run again"
    name = next(iter(traces.recorded_traces()))
    out = handlers.open_recorded(hub, name, False, False, state)
    assert "Replaying" in out["status"] and state.runs, "replay works without the model"
    # the API says the same, and a later successful load hides the banner
    with pytest.raises(RespecError, match="could not|No space|cannot read|CUDA"):
        api.compare_api(hub, CAPS, REPEAT, "{}")
    from tests.test_app_render import tiny_runner
    good = tiny_runner()
    hub._factory = lambda spec: good
    updates = list(handlers.compare_stream(hub, CAPS, REPEAT, {"max_new_tokens": 4}, False, False, False, state))
    assert any("banner" in u and not u["banner"]["visible"] for u in updates) and "done" in updates[-1]["status"]
    assert hub.banner() == ""
