"""The `/compare` API through gradio_client against the app launched in this process (UX.md §6.3):
tiny models for the contract and bad input, the default model for one real run."""
import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

import json  # noqa: E402

import pytest  # noqa: E402
from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from app.session.hub import ModelHub  # noqa: E402
from app.page.ui import build_demo  # noqa: E402
from respec.trace import result_from_json  # noqa: E402
from tests.test_app_render import CAPS, REPEAT, tiny_hub  # noqa: E402


def serve(hub):
    demo = build_demo(hub=hub, caps=CAPS)
    _, url, _ = demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True,
                            ssr_mode=False)
    return demo, url


@pytest.fixture(scope="module")
def client():
    demo, url = serve(tiny_hub())
    try:
        yield Client(url, verbose=False)
    finally:
        demo.close()


def test_compare_is_documented_with_prompt_and_settings(client):
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert "/compare" in api, "The compare run must be callable as api_name='/compare'."
    params = [p["parameter_name"] for p in api["/compare"]["parameters"]]
    assert params == ["prompt", "settings_json"]
    assert len(api["/compare"]["returns"]) == 5


def test_compare_returns_both_texts_traces_and_metrics(client):
    a, b, ta, tb, m = client.predict(REPEAT, '{"max_new_tokens": 12, "theta_H": 20}', api_name="/compare")
    ra, rb = result_from_json(ta), result_from_json(tb)
    assert (ra.text, rb.text) == (a, b) and a.strip() and b.strip()
    assert ra.config.method == "respec" and rb.config.method == "eagle2"
    assert ra.meta["prompt"] == REPEAT and ra.config.trigger.theta_entropy == 20, "Traces record prompt and settings."
    metrics = json.loads(m)
    assert {"respec", "eagle", "comparison"} <= set(metrics)
    assert metrics["respec"]["new_tokens"] == len(ra.tokens) == 12


def test_compare_metrics_carry_acceptance_by_position_and_the_speedup_anatomy(client):
    from respec.anatomy import acceptance_by_depth
    _, _, ta, _, m = client.predict(REPEAT, '{"max_new_tokens": 12, "theta_H": 20, "include_vanilla": true}',
                                    api_name="/compare")
    metrics, ra = json.loads(m), result_from_json(ta)
    respec = metrics["respec"]
    want = acceptance_by_depth(ra.steps)
    assert respec["accept_at_depth"] == [round(want.rate(d), 4) for d in range(1, len(respec["accept_at_depth"]) + 1)]
    assert set(respec["drafts_hold"]) <= {"eagle", "retrieval"}
    a = respec["anatomy"]
    assert a["speedup"] == pytest.approx(respec["speedup"], rel=0.01), "the factors multiply back to the speedup"
    assert a["tokens_per_forward"] == pytest.approx(len(ra.tokens) / (len(ra.steps) + 1), abs=1e-3)
    assert metrics["vanilla"]["anatomy"]["tokens_per_forward"] == 1.0


def test_the_left_column_can_run_suffix_decoding_or_another_peer(client):
    from respec.drafters.suffix import suffix_library
    if suffix_library()[0] is None:
        pytest.skip("arctic-inference is not built here")
    a, _, ta, tb, m = client.predict(REPEAT, '{"max_new_tokens": 12, "column_a": "suffix", "include_vanilla": true}',
                                     api_name="/compare")
    ra, rb = result_from_json(ta), result_from_json(tb)
    metrics = json.loads(m)
    assert ra.config.method == "suffix" and rb.config.method == "eagle2"
    assert metrics["comparison"]["respec_column_method"] == "suffix"
    assert metrics["comparison"]["equal_to_vanilla"]["respec"], "SuffixDecoding is lossless"
    with pytest.raises(AppError, match="column_a"):
        client.predict(REPEAT, '{"column_a": "eagle2"}', api_name="/compare")


def test_empty_settings_mean_defaults(client):
    _, _, ta, _, _ = client.predict("w5 w6 w7", "{}", api_name="/compare")
    cfg = result_from_json(ta).config
    from respec.config import EngineConfig, device_defaults
    want = EngineConfig().with_overrides(device_defaults("cpu"))
    assert cfg.max_new_tokens == CAPS.default_new_tokens, "'{}' must mean the deployment's default length."
    assert cfg.trigger == want.trigger and cfg.candidates == want.candidates, \
        "'{}' must mean the engine's defaults for this device."


@pytest.mark.parametrize("settings,needle", [
    ('{"theta_H": -1}', "theta_entropy must be in"),
    ('{"theta_H": ', "not valid JSON"),
    ('["theta_H"]', "must be a JSON object"),
    ('{"no_such_knob": 1}', "unknown setting"),
    ('{"max_new_tokens": 5000}', "cap of 64"),
    ('{"relax": {"budget": "lots"}}', "must be a number"),
])
def test_bad_settings_come_back_as_clear_errors(client, settings, needle):
    with pytest.raises(AppError, match=needle):
        client.predict(REPEAT, settings, api_name="/compare")


def test_bad_prompts_come_back_as_clear_errors_and_the_app_keeps_serving(client):
    with pytest.raises(AppError, match="prompt is empty"):
        client.predict("  ", "{}", api_name="/compare")
    with pytest.raises(AppError, match="context"):
        client.predict(" ".join(["w5"] * 300), "{}", api_name="/compare")
    a, *_ = client.predict(REPEAT, '{"max_new_tokens": 4}', api_name="/compare")
    assert a.strip(), "After errors the app still answers."


def test_simultaneous_calls_queue_and_all_finish(client):
    jobs = [client.submit(REPEAT, json.dumps({"max_new_tokens": 6, "seed": i}), api_name="/compare") for i in range(3)]
    results = [j.result(timeout=120) for j in jobs]
    assert all(len(r) == 5 for r in results), "Queued runs (concurrency 1) must all complete."


def test_history_records_each_clients_compare_calls(client):
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    assert "/history" in api and api["/history"]["parameters"] == [], "/history takes no arguments."
    assert [p["parameter_name"] for p in api["/compare"]["parameters"]] == ["prompt", "settings_json"], \
        "The session (gr.Request) is not an API parameter."
    own = Client(client.src, verbose=False)          # a fresh session: rows of other tests stay out
    for theta in (1.5, 2.5):
        own.predict(REPEAT, json.dumps({"max_new_tokens": 6, "theta_H": theta}), api_name="/compare")
    data = json.loads(own.predict(api_name="/history"))
    assert [r["run"] for r in data["rows"]] == [1, 2]
    assert [r["changed"]["trigger.theta_entropy"] for r in data["rows"]] == [1.5, 2.5]
    m = data["rows"][0]["methods"]["respec"]
    assert m["new_tokens"] == 6 and m["tokens_per_s"] > 0 and m["speedup_kind"] == "estimated"
    assert {"mean_accepted_length", "trigger_rate", "retrieval_share", "relaxed_tokens"} <= set(m)
    other = json.loads(Client(client.src, verbose=False).predict(api_name="/history"))
    assert other["rows"] == [], "Another client does not see these rows."


@pytest.mark.slow
def test_compare_on_the_default_model():
    from respec.models.loading import default_cache_dir
    if not (default_cache_dir() / "config.json").is_file():
        pytest.skip("the default model is not in the local cache (run scripts/setup.sh)")
    demo, url = serve(ModelHub())
    try:
        a, b, ta, tb, m = Client(url, verbose=False).predict(
            "Name three colors.", '{"max_new_tokens": 8}', api_name="/compare")
        assert a.strip() and b.strip(), "The default model writes text in both columns."
        metrics = json.loads(m)
        assert metrics["respec"]["new_tokens"] == len(result_from_json(ta).tokens) <= 8
        assert result_from_json(tb).meta["model"], "The trace names its model."
    finally:
        demo.close()
