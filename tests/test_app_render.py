"""The explorer's pure layers (render, figures, settings) and its handlers, on tiny-model traces and
on the shipped traces: no server, no browser. A word-level tokenizer gives the tiny models text."""
import functools
import json
import math

import pytest

from app.events import api, handlers

from app.views import figures, render

from app.session import traces
from app.views.decoders import TableDecoder, TokenizerDecoder
from app.session.hub import ModelHub, model_fits
from app.events.runs import finish_run, parse_prompt, stream_run
from app.session.settings import PRESETS, SPECS, Caps, build_config, non_default, parse_settings_json, preset_values
from app.session.state import SessionState
from respec.errors import ConfigError
from respec.runner import Runner, fetched_builtin_models
from respec.trace import result_from_json, result_to_json
from tests.conftest import make_target

WORDS = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(3, 128)]
REPEAT = " ".join(f"w{i}" for i in (5, 6, 7, 8, 9, 10, 11) * 3)
CAPS = Caps(max_new_tokens=64, default_new_tokens=24, max_tree_tokens=64, time_limit_s=60, queue_size=4)


def word_tokenizer():
    """Word-level tokenizer over the tiny models' 128 ids (w3 ... w127; 0-2 special)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.add_special_tokens(["<pad>", "<s>", "</s>"])
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


@functools.lru_cache(maxsize=None)
def tiny_runner(arch: str = "llama", seed: int = 3) -> Runner:
    """One runner per (arch, seed) for the whole session (runs reset the target's cache)."""
    target = make_target(arch, seed=seed)
    target.tokenizer = word_tokenizer()
    return Runner(target)


def tiny_hub() -> ModelHub:
    runner = tiny_runner()
    return ModelHub("tiny", factory=lambda spec: runner, choices=["tiny"])


def stream(runner, prompt, method, **values):
    config = build_config(values, method, "cpu", CAPS)
    decoder = TokenizerDecoder(runner.tokenizer)
    updates = list(stream_run(runner, prompt, config))
    assert updates[-1][1] and not any(done for _, done in updates[:-1]), "Exactly the last update is final."
    return finish_run(updates[-1][0], decoder), updates


@pytest.fixture(scope="module")
def runner():
    return tiny_runner()


@pytest.fixture(scope="module")
def runs(runner):
    """Tiny-model runs of the three columns on a repetitive prompt (retrieval fires). The cost model
    is off: on a tiny model a Python-side draft costs about a forward, so whether retrieval pays
    would depend on this machine's timings (the cost model has its own tests)."""
    respec, updates = stream(runner, REPEAT, "respec", theta_H=20.0, max_new_tokens=30, auto=False)
    eagle, _ = stream(runner, REPEAT, "eagle2", max_new_tokens=30, auto=False)
    vanilla, _ = stream(runner, REPEAT, "vanilla", max_new_tokens=30)
    return {"respec": respec, "eagle": eagle, "vanilla": vanilla, "updates": updates}


# ------------------------------------------------------------------------------- decoding
class ByteTokenizer:
    """ids are UTF-8 bytes: a character may span several tokens."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_cumulative_decoding_keeps_spaces_and_split_characters():
    tokens = list("aé b".encode())                       # é is two bytes: 0xC3 0xA9
    pieces = TokenizerDecoder(ByteTokenizer()).pieces(tokens)
    assert "".join(pieces) == "aé b", "Pieces must concatenate to the decoded text."
    assert pieces == ["a", "", "é", " ", "b"], "A split character shows on the token that completes it."


def test_decoder_cache_follows_a_changed_prefix():
    dec = TokenizerDecoder(ByteTokenizer())
    assert dec.pieces(list(b"abc")) == ["a", "b", "c"]
    assert dec.pieces(list(b"abx")) == ["a", "b", "x"], "A new run must not reuse stale cached text."


# ------------------------------------------------------------------------------- streaming and spans
def test_streamed_run_equals_generate_and_is_a_valid_trace(runner, runs):
    cfg = build_config({"theta_H": 20.0, "max_new_tokens": 30, "auto": False}, "respec", "cpu", CAPS)
    assert runs["respec"].result.tokens == runner.generate(REPEAT, cfg).tokens, \
        "The streamed run must commit the same tokens as Runner.generate."
    partial = [r for r, _ in runs["updates"][:-1]]
    assert [len(p.steps) for p in partial] == list(range(1, len(partial) + 1)), "One update per target forward."
    again = result_from_json(result_to_json(runs["respec"].result))
    assert again.meta["display"]["pieces"] == runs["respec"].decoder.pieces(again.tokens), \
        "The trace carries its text table."


def test_output_spans_cover_the_text_and_label_every_token(runs):
    for key in ("respec", "eagle", "vanilla"):
        run = runs[key]
        spans = render.output_spans(run.result, run.decoder)
        assert len(spans) == len(run.result.tokens), "One span per generated token."
        assert "".join(t for t, _ in spans).replace("↵", "") == "".join(run.decoder.pieces(run.result.tokens))
        labels = [{"relaxed": "retrieval"}.get(lab, lab) for _, lab in spans]
        assert labels == run.result.token_sources(), "Each token is labelled by who proposed it."
    assert set(lab for _, lab in render.output_spans(runs["vanilla"].result, runs["vanilla"].decoder)) == {"target"}
    assert "retrieval" in {lab for _, lab in render.output_spans(runs["respec"].result, runs["respec"].decoder)}, \
        "ReSpec on repeated text must show retrieved tokens."


def test_rejected_drafts_appear_only_on_demand(runs):
    run = runs["eagle"]
    plain = render.output_spans(run.result, run.decoder)
    shown = render.output_spans(run.result, run.decoder, show_rejected=True)
    assert [s for s in shown if s[1] != "rejected"] == plain, "Rejected drafts are inserted, nothing else changes."
    assert any(lab == "rejected" for _, lab in shown), "A random EAGLE head is rejected somewhere."


def test_step_geometry_matches_new_tokens(runs):
    res = runs["respec"].result
    roots, owner = render.step_roots(res), render.token_steps(res)
    for s, r in zip(res.steps, roots):
        assert res.tokens[r] == s.tree.tokens[0], "Step s's root is generated token r_s."
        got = list(res.tokens[r + 1:r + 1 + len(s.new_tokens)])
        assert got == list(s.new_tokens)[:len(got)]
        assert all(owner[i] == s.step for i in range(r + 1, r + 1 + len(got)))


# ------------------------------------------------------------------------------- metrics and diff
def test_metrics_count_the_bonus_and_measure_speedup_against_vanilla(runs):
    res, van = runs["respec"].result, runs["vanilla"].result
    m = render.run_metrics(res, van)
    assert m["mean_accepted_length"] == pytest.approx(1 + res.stats.accepted_tokens / res.stats.steps)
    assert m["speedup_kind"] == "measured"
    assert m["speedup"] == pytest.approx(res.stats.tokens_per_s / van.stats.tokens_per_s)
    assert render.run_metrics(van, van)["speedup"] == pytest.approx(1.0)
    est = render.run_metrics(res)
    assert est["speedup_kind"] == "estimated" and est["speedup"] > 0
    decode = res.stats.new_tokens / (res.wall_time_s - res.prefill_ms / 1000)
    van_decode = van.stats.new_tokens / (van.wall_time_s - van.prefill_ms / 1000)
    assert m["decode_tokens_per_s"] == pytest.approx(decode) and decode > res.stats.tokens_per_s
    assert m["decode_speedup"] == pytest.approx(decode / van_decode) and est["decode_speedup"] is None
    headers, rows = render.metrics_rows([("ReSpec", res), ("vanilla", van)], van)
    assert headers == ["metric", "ReSpec", "vanilla"] and rows[1][2] == "1.00×"
    assert rows[3][0] == "decode-only speedup" and rows[3][2] == "1.00×"
    html = render.metrics_html([("ReSpec", res)], None)
    assert "≈" in html and "title=" in html, "Estimated speedups are marked, definitions are tooltips."


def test_the_regime_is_said_from_the_recorded_verify_cost_curve(runs):
    """Compare's note and the teaching narration turn the verify-cost curve measured at load into
    what a tree costs in plain steps on this machine."""
    import dataclasses
    import types
    from app.views import anatomy_view
    curve = {1: 100.0, 2: 101.0, 4: 107.0, 8: 184.0, 16: 246.0}
    assert anatomy_view.plain_steps(curve, 4) == pytest.approx(1.07)
    assert anatomy_view.plain_steps(curve, 12) == pytest.approx((184 + 246) / 2 / 100)
    assert anatomy_view.plain_steps(curve, 32) is None and anatomy_view.plain_steps({4: 1.0}, 4) is None
    recorded = types.SimpleNamespace(meta={"verify_cost_ms": {str(k): v for k, v in curve.items()}})
    assert anatomy_view.regime_sentence([("a", recorded)]).startswith(
        "On this machine a 4-token tree costs 1.07 plain steps and a 16-token tree 2.46 ")
    assert anatomy_view.regime_sentence([("a", types.SimpleNamespace(meta={}))]) == ""
    res = runs["respec"].result
    res = dataclasses.replace(res, meta={**res.meta, "verify_cost_ms": {str(k): v for k, v in curve.items()}})
    k = next(i for i, s in enumerate(res.steps) if s.num_draft and len(s.tree.tokens) <= 16)
    n = len(res.steps[k].tree.tokens)
    said = render.narrate(res, k, runs["respec"].decoder)
    assert f"a {n}-token tree costs {anatomy_view.plain_steps(curve, n):.2f} plain steps" in said


def test_diff_and_badge():
    dec = TableDecoder(vocab={i: f" w{i}" for i in range(20)})
    same, first, spans = render.aligned_diff([5, 6, 7], [5, 6, 7], dec)
    assert same and first is None and spans == [(" w5 w6 w7", None)]
    same, first, spans = render.aligned_diff([5, 6, 7, 8], [5, 9, 7, 8], dec)
    assert not same and first == 1
    assert (" w6", "only in A") in spans and (" w9", "only in B") in spans
    assert "identical" in render.badge_html(True, None, "ReSpec", "EAGLE-2", 3, 3)
    assert "differ from token 1" in render.badge_html(False, 1, "ReSpec", "EAGLE-2", 4, 4)


def test_lossless_settings_give_identical_outputs(runner):
    a, _ = stream(runner, REPEAT, "respec", theta_H=20.0, budget=0, max_new_tokens=24)
    b, _ = stream(runner, REPEAT, "eagle2", max_new_tokens=24)
    assert render.aligned_diff(a.result.tokens, b.result.tokens, a.decoder)[0], \
        "With budget 0 in fp64 ReSpec must write exactly what EAGLE-2 writes."


# ------------------------------------------------------------------------------- figures
def test_tree_layout_of_a_hand_drawn_tree():
    #        0
    #      /   \
    #     1     2        leaves 3, 4, 2 get rows 0, 1, 2; node 1 sits at 0.5; the root at 1.25
    #    / \
    #   3   4
    rows = figures.tree_layout([-1, 0, 0, 1, 1])
    assert rows == [1.25, 0.5, 2.0, 0.0, 1.0]


def test_tree_figure_draws_every_node_and_the_accepted_path(runs):
    run = runs["respec"]
    step = next(s for s in run.result.steps if s.num_accepted > 0)
    fig = figures.tree_figure(step, run.decoder, "t")
    nodes = sum(len(t.x) for t in fig.data if t.mode and "markers" in t.mode and t.x and t.x[0] is not None)
    assert nodes == step.tree.size + 1, "Every node plus the bonus token is drawn."
    path = next(t for t in fig.data if t.name == "accepted path")
    assert len(path.x) == 3 * (step.num_accepted + 1), "One segment per accepted node plus the bonus edge."
    hover = " ".join(h for t in fig.data if t.hovertext for h in t.hovertext)
    assert repr(run.decoder.piece(step.tree.tokens[1])) in hover.replace("&#x27;", "'"), "Hover shows token text."


def test_entropy_figure_marks_theta_retrieval_and_steps(runs):
    run = runs["respec"]
    fig = figures.entropy_figure(run.result, run.decoder, selected=2)
    assert any(getattr(s, "y0", None) == run.result.config.trigger.theta_entropy for s in fig.layout.shapes), \
        "θ_H is drawn as a line."
    assert any("retrieval step" in (t.name or "") for t in fig.data)
    owners = render.token_steps(run.result)
    pts = [t for t in fig.data if t.name in ("target", "EAGLE-2", "retrieval", "relaxed")]
    for t in pts:
        assert [owners[x] for x in t.x] == list(t.customdata), "customdata is the step that owns each token."
    assert sum(len(t.x) for t in pts) == len(run.result.tokens)


def test_metrics_figure_has_histograms_and_timing(runs):
    fig = figures.metrics_figure([("ReSpec", runs["respec"].result), ("EAGLE-2", runs["eagle"].result)])
    names = [t.name for t in fig.data]
    assert names[:2] == ["ReSpec", "EAGLE-2"] and "draft" in names and "verify" in names
    assert list(fig.data[0].y) == list(runs["respec"].result.stats.accept_length_hist)


def test_one_view_update_computes_each_runs_anatomy_once(runs, monkeypatch):
    """A full update (metrics table, anatomy chart, explorer line, narration) walks each run's steps
    for its acceptance by draft position once (it was up to five times for the run on screen), its
    totals once and its anatomy once; a later slider move or comparison recomputes none of them."""
    import collections
    import dataclasses

    import respec.anatomy as respec_anatomy
    from app.events import updates
    from app.session.state import Run

    calls: collections.Counter = collections.Counter()
    for name in ("acceptance_by_depth", "totals_of", "anatomy"):
        def counted(*args, _f=getattr(respec_anatomy, name), _name=name, **kwargs):
            calls[_name] += 1
            return _f(*args, **kwargs)
        monkeypatch.setattr(respec_anatomy, name, counted)
    state = SessionState()
    for key in ("respec", "eagle", "vanilla"):          # fresh result objects: nothing computed for them yet
        state.put(key, Run(result=dataclasses.replace(runs[key].result), decoder=runs[key].decoder))
    updates.full_update(state, show_rejected=False, teaching=True)
    assert calls == {"acceptance_by_depth": 3, "totals_of": 3, "anatomy": 3}, \
        f"One update computes each of the 3 runs' anatomy once, got {dict(calls)}."
    calls.clear()
    state.step = 1
    updates.step_views(state, teaching=True)
    updates.comparison_update(state)
    assert not calls["acceptance_by_depth"] and not calls["totals_of"], \
        f"A result's acceptance and totals are reused by later updates, got {dict(calls)}."


def test_without_vanilla_the_anatomy_note_sits_in_the_waterfall_panel(runs):
    """Compare without vanilla: the chart's note names the waterfall's axes, and a trace keeps those
    axes alive (plotly.js drops axes no trace uses; a note naming one fell back to the first panel's
    data coordinates and stretched its depth axis to -2). The depth axis spans the depths drawn."""
    from app.views import anatomy_view
    pair = [("ReSpec", runs["respec"].result), ("EAGLE-2", runs["eagle"].result)]
    fig = anatomy_view.anatomy_figure(pair, None)
    notes = [a for a in fig.layout.annotations if "also run vanilla" in (a.text or "")]
    assert len(notes) == 1 and (notes[0].xref, notes[0].yref) == ("x2 domain", "y2 domain"), notes
    assert any((t.xaxis, t.yaxis) == ("x2", "y2") for t in fig.data), "A trace must keep the waterfall's axes."
    deepest = max(len(anatomy_view.depth_metrics(r)["accept_at_depth"]) for _, r in pair)
    lo, hi = fig.layout.xaxis.range
    assert (lo, hi) == (0.5, deepest + 0.5) and lo > -2, "The depth axis keeps the depths drawn."
    with_vanilla = anatomy_view.anatomy_figure(pair + [("vanilla", runs["vanilla"].result)], runs["vanilla"].result)
    assert not any("also run vanilla" in (a.text or "") for a in with_vanilla.layout.annotations)
    assert sum(t.type == "waterfall" and t.xaxis == "x2" for t in with_vanilla.data) == 2


# ------------------------------------------------------------------------------- step explorer
def test_candidates_decision_and_narration_show_respec_records(runs):
    run = runs["respec"]
    i = next(s.step for s in run.result.steps if s.candidates)
    step = run.result.steps[i]
    headers, rows = render.candidate_rows(step, run.decoder)
    assert headers[:2] == ["end_pos", "match_len"] and len(rows) == len(step.candidates)
    assert "score_before" in headers and "score_after" in headers
    text = render.narrate(run.result, i, run.decoder)
    assert "θ_H" in text and "candidate" in text
    if step.num_accepted:
        assert f"Accepted {step.num_accepted} of {step.num_draft}" in text
    elif step.num_draft:
        assert f"Accepted none of the {step.num_draft} drafts" in text
    else:
        assert "Accepted" not in text and "Drafted 0 token(s)" in text
    assert "Decision" in render.decision_md(step)
    h, r = render.node_rows(step, run.decoder)
    assert len(r) == step.tree.size + 1 and r[-1][4] == "target"


def test_events_and_jumps(runs):
    state = SessionState()
    state.put("respec", runs["respec"])
    ev = render.step_events(runs["respec"].result)
    assert ev["retrieval"], "The repetitive prompt triggers retrieval."
    out = handlers.jump("retrieval", False, state)
    assert state.step == render.next_event(ev["retrieval"], 0)
    assert out["step_slider"]["value"] == state.step and "tree_plot" in out
    assert render.next_event([2, 5], 5) == 2 and render.next_event([], 0) is None
    state.step = 0
    handlers.jump("next", True, state)
    assert state.step == 1
    assert handlers.select_step(10_000, True, state) and state.step == len(runs["respec"].result.steps) - 1
    assert handlers.tick(False, state)["timer"].active is False, "Play stops at the last step."


# ------------------------------------------------------------------------------- settings
def test_settings_accept_aliases_nested_objects_and_device_defaults():
    cfg = build_config({"theta_H": 2.5, "tree": {"depth": 3}, "S0": 0.4}, "respec", "cpu", CAPS)
    assert cfg.trigger.theta_entropy == 2.5 and cfg.tree.depth == 3 and cfg.candidates.s0 == 0.4
    assert cfg.max_new_tokens == CAPS.default_new_tokens and cfg.tree.auto is True and cfg.tree.total_tokens == 16
    assert build_config({"auto": False, "total_tokens": 9}, "eagle2", "cpu", CAPS).tree.total_tokens == 9
    assert parse_settings_json("") == {} and parse_settings_json('{"tree": {"depth": 2}}') == {"tree.depth": 2}
    for name in PRESETS:
        vals = preset_values(name, "cpu", CAPS)
        assert set(vals) == {s.key for s in SPECS} | {"tree.auto"}
    assert preset_values("lossless", "cpu", CAPS)["relax.budget"] == 0
    assert non_default({**preset_values("device defaults", "cpu", CAPS), "trigger.theta_entropy": 2.0}, "cpu", CAPS) \
        == {"trigger.theta_entropy": 2.0}


@pytest.mark.parametrize("values,needle", [
    ({"theta_H": -1}, "theta_entropy"),
    ({"max_new_tokens": 65}, "cap of 64"),
    ({"tree.total_tokens": 100}, "cap of 64"),
    ({"nope": 1}, "unknown setting"),
    ({"alpha": "x"}, "must be a number"),
    ({"include_vanilla": "maybe"}, "true or false"),
])
def test_bad_settings_raise_a_clear_message(values, needle):
    with pytest.raises(ConfigError, match=needle):
        build_config(values, "respec", "cpu", CAPS)


def test_bad_settings_json_is_a_clear_error():
    for text, needle in (("{", "not valid JSON"), ("[1]", "JSON object")):
        with pytest.raises(ConfigError, match=needle):
            parse_settings_json(text)


# ------------------------------------------------------------------------------- handlers
def test_compare_stream_runs_both_methods_and_fills_every_view():
    hub, state = tiny_hub(), SessionState()
    values = {"max_new_tokens": 20, "theta_H": 20.0, "tree.auto": False}
    updates = list(handlers.compare_stream(hub, CAPS, REPEAT, values, True, False, True, state))
    final = updates[-1]
    assert set(state.runs) == {"respec", "eagle", "vanilla"}
    assert final["status"].startswith("✔ done") and "ms server render time" in final["status"]
    assert "respec-badge" in final["badge"] and "1.00×" in final["metrics"], "Vanilla makes speedups measured."
    assert final["tree_plot"].data and final["entropy_plot"].data
    assert all(final[f"{k}_out"] for k in ("respec", "eagle", "vanilla"))
    path = final["respec_download"]["value"]
    assert result_from_json(open(path, encoding="utf-8").read()).tokens == state.runs["respec"].result.tokens
    streamed = [u for u in updates if "respec_out" in u and "status" in u and u["status"].startswith("▶ ReSpec")]
    assert streamed or len(state.runs["respec"].result.steps) < 3, "Long runs stream intermediate updates."


@pytest.mark.parametrize("prompt,values,needle", [
    ("   ", {}, "prompt is empty"),
    (REPEAT, {"theta_H": 99}, "Bad settings"),
    (" ".join(["w5"] * 300), {"max_new_tokens": 8}, "context"),
])
def test_compare_stream_reports_bad_input_in_the_page(prompt, values, needle):
    hub, state = tiny_hub(), SessionState()
    updates = list(handlers.compare_stream(hub, CAPS, prompt, values, False, False, False, state))
    assert needle in updates[-1]["status"], updates[-1]["status"]


def test_compare_api_returns_texts_traces_and_metrics():
    hub = tiny_hub()
    a, b, ta, tb, m = api.compare_api(hub, CAPS, REPEAT, '{"max_new_tokens": 12, "include_vanilla": true}')
    ra, rb = result_from_json(ta), result_from_json(tb)
    assert ra.text == a and rb.text == b and ra.meta["prompt"] == REPEAT and ra.config.sampling.seed == 0
    metrics = json.loads(m)
    assert set(metrics) == {"respec", "eagle", "vanilla", "comparison"}
    assert metrics["respec"]["speedup_kind"] == "measured"
    with pytest.raises(ConfigError):
        api.compare_api(hub, CAPS, REPEAT, '{"w": -3}')


# ------------------------------------------------------------------------------- replay
def test_shipped_traces_replay_in_every_view_without_a_model(tmp_path):
    shipped = traces.recorded_traces()
    assert shipped, "assets/traces must ship at least one recorded comparison."
    hub = ModelHub("default", factory=lambda spec: pytest.fail("replay must not load a model"))
    for name, files in shipped.items():
        assert set(files) >= {"respec", "eagle"}, f"{name}: a pair of traces"
        state = SessionState()
        out = handlers.open_recorded(hub, name, True, True, state)
        assert out["status"].startswith("Replaying"), out["status"]
        for key in files:
            run = state.runs[key]
            assert isinstance(run.decoder, TableDecoder)
            assert "".join(run.decoder.pieces(run.result.tokens)).strip() == run.result.text.strip()
            assert out[f"{key}_out"], f"{name}: {key} output rendered"
        for i in range(len(state.current().result.steps)):
            assert handlers.select_step(i, True, state)["tree_plot"].data


def test_uploads_replay_and_reject_foreign_files(tmp_path):
    hub = ModelHub("default", factory=lambda spec: pytest.fail("replay must not load a model"))
    files = traces.recorded_traces()[next(iter(traces.recorded_traces()))]
    state = SessionState()
    out = handlers.open_uploads(hub, [str(p) for p in files.values()], False, False, state)
    assert "2 uploaded" in out["status"] and set(state.runs) == set(files)
    bad = tmp_path / "bad.json"
    for text in ('{"schema": "other"}', "not json", json.dumps({"schema": "respec-trace", "version": 99})):
        bad.write_text(text)
        out = handlers.open_uploads(hub, [str(bad)], False, False, state)
        assert out["status"].startswith("⚠ Could not read bad.json"), out["status"]
        assert set(state.runs) == set(files), "A bad upload leaves the runs on screen alone."


def test_render_time_per_update_is_small(runs):
    """Not a timing test: records the server-side cost of one streamed update for the report."""
    import time
    run = runs["respec"]
    t0 = time.perf_counter()
    for _ in range(5):
        render.output_spans(run.result, run.decoder)
        render.live_line(run.result)
    per = (time.perf_counter() - t0) / 5 * 1000
    assert math.isfinite(per)


def test_a_newer_run_supersedes_a_cancelled_one():
    """Stop / a closed tab can leave a run's thread mid-step; the next run must not interleave with it."""
    hub, old_state = tiny_hub(), SessionState()
    old = handlers.compare_stream(hub, CAPS, REPEAT, {"max_new_tokens": 30}, False, False, False, old_state)
    for update in old:                                   # up to the first streamed update
        if update.get("respec_live", "").startswith("running"):
            break
    new = list(handlers.compare_stream(hub, CAPS, REPEAT, {"max_new_tokens": 6}, False, False, False, SessionState()))
    assert new[-1]["status"].startswith("✔ done"), "The new run completes."
    rest = list(old)
    assert "superseded" in rest[-1]["status"], "The old run stops at its next step instead of touching the cache."


def test_stop_ends_the_stream_with_a_stopped_status():
    """Stop marks the tab's state; the run's stream notices at its next step and its last word is
    "stopped", so an update already in flight cannot leave the page saying "step N"."""
    from app.views.text import STOPPED
    from app.page.ui import _claim, _stop
    hub, state = tiny_hub(), SessionState()
    _claim(state)
    run = handlers.compare_stream(hub, CAPS, REPEAT, {"max_new_tokens": 30, "tree.auto": False}, False, False,
                                  False, state)
    for update in run:                                   # up to the first streamed update
        if update.get("respec_live", "").startswith("running"):
            break
    assert _stop(state) == STOPPED
    rest = list(run)
    assert rest and rest[-1] == {"status": STOPPED}, rest[-1:]
    assert "respec" not in state.runs and not state.running
    _claim(state)                                        # the next Run clears the stop
    assert not state.stop_requested
    again = list(handlers.compare_stream(hub, CAPS, REPEAT, {"max_new_tokens": 6}, False, False, False, state))
    assert again[-1]["status"].startswith("✔ done")


def test_a_json_message_list_is_a_chat_prompt():
    chat = [{"role": "user", "content": "w5 w6 w7"}, {"role": "assistant", "content": "w8"},
            {"role": "user", "content": "w5 w6"}]
    assert parse_prompt(json.dumps(chat)) == chat
    assert parse_prompt("[not json") == "[not json" and parse_prompt("[1, 2]") == "[1, 2]"
    _, _, ta, _, _ = api.compare_api(tiny_hub(), CAPS, json.dumps(chat), '{"max_new_tokens": 4}')
    assert result_from_json(ta).meta["prompt"] == chat, "The trace records the chat."


def test_model_picker_offers_only_models_that_fit(tmp_path):
    huge = tmp_path / "huge"
    huge.mkdir()
    with open(huge / "model.safetensors", "wb") as fh:   # sparse file: claims 10 TB without using disk
        fh.truncate(10 * 10**12)
    assert model_fits("default") and not model_fits(str(huge))
    hub = ModelHub(choices=["default", str(huge)], factory=lambda spec: None)
    assert hub.choices == ["default"], "A model too big for this machine must not be offered."


def test_bad_environment_values_warn_and_fall_back_to_the_defaults(monkeypatch, caplog):
    """Environment variables are read when used, never at import; a bad value must not stop the app."""
    from app.session.settings import env_float, env_int
    from app.page.ui import gpu_duration_s, launch_kwargs
    for name, value in (("RESPEC_GPU_DURATION", "two minutes"), ("RESPEC_STREAM_INTERVAL", "fast"),
                        ("RESPEC_MAX_SESSIONS", "many"), ("RESPEC_MODELS", "a=, b"), ("RESPEC_MODEL", "=h")):
        monkeypatch.setenv(name, value)
    with caplog.at_level("WARNING", logger="respec.app"):
        assert gpu_duration_s() == 120 and launch_kwargs()["state_session_capacity"] == 300
        assert env_float("RESPEC_STREAM_INTERVAL", 0.25) == 0.25 and env_int("RESPEC_MAX_SESSIONS", 300) == 300
        hub = ModelHub(factory=lambda spec: None)
    offered = ["default", *fetched_builtin_models()]                 # built-in models already in the cache
    assert (hub.choices, hub.spec) == (offered, "default"), "a malformed model list offers the default model"
    for name in ("RESPEC_GPU_DURATION", "RESPEC_STREAM_INTERVAL", "RESPEC_MAX_SESSIONS", "RESPEC_MODELS", "RESPEC_MODEL"):
        assert name in caplog.text, f"the warning must name {name}"


def test_paper_preset_restores_the_papers_thresholds_over_device_defaults():
    from app.session.settings import preset_values
    paper = preset_values("paper defaults", "cpu", CAPS)
    device = preset_values("device defaults", "cpu", CAPS)
    assert paper["trigger.theta_entropy"] == 1.5 and paper["candidates.min_match"] == 3
    assert device["trigger.theta_entropy"] == 3.0 and device["candidates.min_match"] == 2
    from respec.config import PRESETS as ENGINE_PRESETS
    for key, value in ENGINE_PRESETS["paper"].items():
        assert paper[key] == value, f"the page's paper preset and the engine's differ at {key}"
    assert paper["tree.auto"] is False and (paper["tree.total_tokens"], paper["tree.depth"], paper["tree.top_k"]) \
        == (60, 5, 10), "EAGLE-2's published fixed tree, no cost model"
    small = Caps(max_new_tokens=64, default_new_tokens=24, max_tree_tokens=32, time_limit_s=60, queue_size=4)
    assert preset_values("paper defaults", "cpu", small)["tree.total_tokens"] == 32, "tree sizes obey the cap"


def test_compare_settings_json_takes_an_engine_preset():
    assert parse_settings_json('{"preset": "paper", "theta_H": 2}') == {"preset": "paper", "trigger.theta_entropy": 2}
    with pytest.raises(ConfigError, match="unknown preset 'fast'; choose one of device, paper"):
        parse_settings_json('{"preset": "fast"}')
    with pytest.raises(ConfigError, match="unknown preset"):
        parse_settings_json('{"preset": 3}')
    cfg = build_config({"preset": "paper", "theta_H": 2}, "respec", "cpu", CAPS)
    assert cfg.trigger.theta_entropy == 2, "explicit settings win over the preset"
    assert (cfg.tree.total_tokens, cfg.tree.auto, cfg.candidates.min_match, cfg.candidates.tree_budget) == (60, False, 3, 60)
    assert build_config({"preset": "device"}, "respec", "cpu", CAPS) == build_config({}, "respec", "cpu", CAPS)
    _, _, ta, tb, m = api.compare_api(tiny_hub(), CAPS, REPEAT, '{"preset": "paper", "max_new_tokens": 4}')
    for trace in (ta, tb):
        c = result_from_json(trace).config
        assert (c.tree.total_tokens, c.tree.depth, c.tree.top_k, c.tree.auto) == (60, 5, 10, False)
        assert c.trigger.theta_entropy == 1.5 and c.candidates.l_max == 16
    assert json.loads(m)["comparison"]["preset"] == "paper"
