"""The benchmark lab: summary maths on hand-made records, resumable runs, the transformers peers
(`hf-greedy`, `hf-pld`) compared to vanilla the same way as our methods, and the report files."""
import json

import pandas as pd
import pytest

from respec.lab.bench import (PEERS, Question, compare_to_vanilla, parse_bench_methods, run_bench, summarize,
                          summary_table_markdown)
from respec.config import EngineConfig
from respec.errors import ConfigError, RespecError
from tests.test_app_render import tiny_runner


def _rec(qid, cat, method, *, new, wall, steps, committed, match=True, lossless=True, relaxed=0, retr=0, fired=0,
         rouge=1.0, nll=None):
    return {"question_id": qid, "category": cat, "method": method, "new_tokens": new, "wall_s": wall,
            "tokens_per_s": new / wall, "steps": steps, "committed": committed, "relaxed_tokens": relaxed,
            "retrieval_steps": retr, "trigger_fired": fired, "matches_vanilla": match, "lossless": lossless,
            "rouge_l_vs_vanilla": rouge, "nll_ratio": nll}


def test_summary_maths_on_hand_made_records():
    records = [
        _rec(1, "qa", "vanilla", new=10, wall=1.0, steps=9, committed=9),
        _rec(2, "qa", "vanilla", new=20, wall=4.0, steps=19, committed=19),
        # sam: question 1 at 20 tok/s, question 2 at 10 tok/s; 6 steps commit 12 tokens (MAT 2, bonus included)
        _rec(1, "qa", "sam", new=10, wall=0.5, steps=3, committed=9, retr=2, fired=0),
        _rec(2, "qa", "sam", new=20, wall=2.0, steps=3, committed=3, match=False, lossless=True, rouge=0.5),
        _rec(3, "rag", "vanilla", new=8, wall=2.0, steps=7, committed=7),
        _rec(3, "rag", "respec", new=8, wall=1.0, steps=4, committed=7, match=False, lossless=False, relaxed=2,
             retr=4, fired=3, rouge=0.8, nll=1.1),
    ]
    s = summarize(pd.DataFrame(records)).set_index(["category", "method"])
    qa_sam = s.loc[("qa", "sam")]
    # Spec-Bench speed.py: mean of per-question tokens/s, ratio of means
    assert qa_sam.tokens_per_s == pytest.approx((20 + 10) / 2)
    assert qa_sam.speedup_vs_vanilla == pytest.approx(15 / ((10 + 5) / 2))
    assert qa_sam.mean_accepted == pytest.approx((9 + 3) / (3 + 3)), "MAT = committed / steps, bonus included"
    assert qa_sam.exact_match_rate == 0.5 and qa_sam.lossless_rate == 1.0 and qa_sam.rouge_l_vs_vanilla == 0.75
    assert qa_sam.retrieval_step_share == pytest.approx(2 / 6)
    rag = s.loc[("rag", "respec")]
    assert rag.speedup_vs_vanilla == pytest.approx(8 / 4) and rag.trigger_rate == pytest.approx(3 / 4)
    assert rag.relaxed_per_token == pytest.approx(2 / 8) and rag.nll_ratio == pytest.approx(1.1)
    assert rag.lossless_rate == 0.0
    overall = s.loc[("overall", "vanilla")]
    assert overall.tokens_per_s == pytest.approx((10 + 5 + 4) / 3) and overall.speedup_vs_vanilla == 1.0
    md = summary_table_markdown(summarize(pd.DataFrame(records)))
    assert "| qa | sam | 2 | 15.0 | 2.00x |  |  |  | 2.00 |" in md, \
        "no engine totals and no token times: the decode-only and same-length cells stay empty"
    assert rag.trie_branching != rag.trie_branching, "Records without the branching counts: no figure (NaN)."


def test_trie_branching_share_counts_steps_that_chose_two_candidates():
    recs = [{**_rec(1, "rag", "respec", new=8, wall=1.0, steps=4, committed=7), "multi_chosen_steps": 4,
             "branching_steps": 3},
            {**_rec(2, "rag", "respec", new=8, wall=1.0, steps=4, committed=7), "multi_chosen_steps": 0,
             "branching_steps": 0},
            {**_rec(1, "rag", "sam", new=8, wall=1.0, steps=4, committed=7), "multi_chosen_steps": 0,
             "branching_steps": 0}]
    s = summarize(pd.DataFrame(recs)).set_index(["category", "method"])
    assert s.loc[("rag", "respec")].trie_branching == pytest.approx(3 / 4)
    assert s.loc[("rag", "sam")].trie_branching != s.loc[("rag", "sam")].trie_branching


def test_compare_to_vanilla_uses_the_divergence_gap():
    ref = {"tokens": [1, 2, 3, 4], "margins": [3.0, 0.1, 2.0, 5.0], "nll_per_token": 2.0}
    rec = compare_to_vanilla({"tokens": [1, 9, 3], "nll_per_token": 2.2}, ref, tol=0.5)
    assert rec["first_divergence"] == 1 and rec["divergence_gap"] == 0.1 and rec["lossless"] is True
    assert rec["nll_ratio"] == pytest.approx(1.1) and 0 < rec["rouge_l_vs_vanilla"] < 1
    rec = compare_to_vanilla({"tokens": [1, 2, 9, 4], "nll_per_token": None}, ref, tol=0.5)
    assert rec["divergence_gap"] == 2.0 and rec["lossless"] is False and rec["nll_ratio"] is None


def test_bench_methods_include_the_peers_and_refuse_unknown_ones():
    assert parse_bench_methods("vanilla, hf-pld,sam,hf-pld") == ["vanilla", "hf-pld", "sam"]
    with pytest.raises(ConfigError, match="unknown method 'hf-medusa'"):
        parse_bench_methods("vanilla,hf-medusa")


QUESTIONS = [Question(1, "qa", ("w5 w6 w7 w8 w5 w6 w7 w8 w5",)),
             Question(2, "rag", ("w9 w10 w11 w9 w10", "w12 w13 w12 w13")),
             Question(3, "summarization", ("w20 w21 w22 w23 w20 w21 w22",))]


def _bench(tmp_path, methods, **kw):
    runner = tiny_runner("qwen2", seed=4)
    base = EngineConfig().with_overrides({"max_new_tokens": 12, "sam.len_threshold": 2, "tree.total_tokens": 8,
                                          "tree.depth": 3, "tree.top_k": 3})
    return runner, run_bench(runner, QUESTIONS, methods, base, tmp_path / "out", progress=False, **kw)


def test_peers_are_measured_like_our_methods_and_match_vanilla(tmp_path):
    _, summary = _bench(tmp_path, ["vanilla", "sam", *PEERS])
    recs = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert len(recs) == len(QUESTIONS) * 4
    for r in recs:
        assert r["matches_vanilla"], f"{r['method']} q{r['question_id']}: greedy on a float64 model equals vanilla"
    pld = [r for r in recs if r["method"] == "hf-pld"]
    assert all(r["steps"] >= 1 and r["committed"] == r["new_tokens"] - len(QUESTIONS[[q.question_id for q in QUESTIONS].index(r["question_id"])].turns)
               for r in pld)
    greedy = summary[(summary.method == "hf-greedy") & (summary.category == "overall")].iloc[0]
    assert greedy.mean_accepted == pytest.approx(1.0), "hf-greedy: one token per forward"
    for name in ("summary.csv", "summary.md", "speedup.html", "acceptance.html", "run.json", "machine.json"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    machine = json.loads((tmp_path / "out" / "machine.json").read_text())
    assert machine["forward"] == "eager" and machine["torch_threads"] >= 1 and isinstance(machine["cpu_flags"], list)
    assert machine["linear_layout"].startswith("linear layout")
    assert "Speedup over vanilla" in (tmp_path / "out" / "speedup.html").read_text()
    for r in recs:      # when each token was there (peers excepted): one time per token, never decreasing
        if r["method"] in PEERS:
            assert "token_ms" not in r
            continue
        assert len(r["token_ms"]) == r["new_tokens"] and r["token_ms"] == sorted(r["token_ms"])
        assert 0 < r["token_ms"][-1] <= r["wall_s"] * 1000 + 0.1
    assert greedy.speedup_same_length != greedy.speedup_same_length, "a peer has no token times: NaN"
    sam = summary[(summary.method == "sam") & (summary.category == "overall")].iloc[0]
    assert sam.speedup_same_length > 0


def _timed(qid, method, token_ms, repeat=0):
    n = len(token_ms)
    return {**_rec(qid, "rag", method, new=n, wall=token_ms[-1] / 1000, steps=n, committed=n),
            "token_ms": token_ms, "repeat": repeat}


def test_outputs_of_different_lengths_are_compared_at_the_length_they_share():
    """A 300 ms prefill, then vanilla writes 10 tokens 10 ms apart; eagle2's output (a bf16 tie
    taken the other way) stops after 3, each 5 ms apart. Spec-Bench's ratio of tokens/s charges
    eagle2 the whole prefill over 3 tokens; at the 3 tokens both reach, eagle2 is the faster."""
    vanilla = [300.0 + 10 * i for i in range(10)]
    eagle = [300.0, 305.0, 310.0]
    s = summarize(pd.DataFrame([_timed(1, "vanilla", vanilla), _timed(1, "eagle2", eagle)])).set_index(
        ["category", "method"]).loc[("rag", "eagle2")]
    assert s.speedup_vs_vanilla == pytest.approx((3 / 0.310) / (10 / 0.390))
    assert s.speedup_same_length == pytest.approx((3 / 310) / (3 / 320))
    # equal lengths: the two ratios agree (a ratio of means over questions and repeats)
    recs = [_timed(1, "vanilla", [100.0, 200.0]), _timed(1, "sam", [50.0, 100.0]),
            _timed(2, "vanilla", [10.0, 20.0, 40.0]), _timed(2, "sam", [10.0, 20.0, 30.0]),
            _timed(1, "vanilla", [100.0, 250.0], repeat=1), _timed(1, "sam", [50.0, 125.0], repeat=1)]
    s = summarize(pd.DataFrame(recs)).set_index(["category", "method"]).loc[("rag", "sam")]
    assert s.speedup_same_length == pytest.approx(s.speedup_vs_vanilla)
    # records without token times (older files): NaN, not a number made up
    old = summarize(pd.DataFrame([_rec(1, "qa", "vanilla", new=4, wall=1.0, steps=4, committed=4),
                                  _rec(1, "qa", "sam", new=4, wall=0.5, steps=2, committed=4)]))
    assert old.speedup_same_length.iloc[-1] != old.speedup_same_length.iloc[-1]


def test_two_runs_are_compared_per_category_and_method_at_equal_length():
    from respec.lab.report import compare_runs
    eager = pd.DataFrame([_timed(1, "vanilla", [300.0 + 40 * i for i in range(10)]),
                          _timed(1, "eagle2", [300.0 + 40 * i for i in range(6)])])
    compiled = pd.DataFrame([_timed(1, "vanilla", [300.0 + 20 * i for i in range(10)]),
                             _timed(1, "eagle2", [300.0 + 20 * i for i in range(10)])])
    t = compare_runs(eager, compiled).set_index(["category", "method"])
    assert list(t.index) == [("rag", "vanilla"), ("rag", "eagle2"), ("overall", "vanilla"), ("overall", "eagle2")]
    assert t.loc[("rag", "vanilla")].ratio == pytest.approx((10 / 0.480) / (10 / 0.660))
    assert t.loc[("rag", "vanilla")].ratio_same_length == pytest.approx(t.loc[("rag", "vanilla")].ratio)
    # eagle2's eager output was shorter: at its 6 tokens the compiled run took 400 ms against 500
    assert t.loc[("rag", "eagle2")].ratio_same_length == pytest.approx(500 / 400)
    assert t.loc[("rag", "eagle2")].ratio == pytest.approx((10 / 0.480) / (6 / 0.500))


def test_a_rerun_skips_finished_records_and_redoes_a_cut_one(tmp_path, monkeypatch):
    runner, first = _bench(tmp_path, ["vanilla", "sam"])
    path = tmp_path / "out" / "results.jsonl"
    lines = path.read_text().splitlines()
    calls = []
    import respec.lab.bench as bench
    real = bench.run_question
    monkeypatch.setattr(bench, "run_question", lambda *a, **k: calls.append(a[1].question_id) or real(*a, **k))
    _, again = _bench(tmp_path, ["vanilla", "sam"])
    assert calls == [], "every record was finished: nothing reruns"
    assert path.read_text().splitlines() == lines
    path.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])   # an interrupted write
    _, third = _bench(tmp_path, ["vanilla", "sam"])
    assert calls == [QUESTIONS[-1].question_id], "only the cut record reruns"
    assert [json.loads(x)["tokens"] for x in path.read_text().splitlines()] == [json.loads(x)["tokens"] for x in lines]
    timing = ["tokens_per_s", "speedup_vs_vanilla", "decode_tokens_per_s", "decode_speedup", "speedup_same_length", "speedup_std", "speedup_min", "speedup_max",
              "step_cost", "verify_ms_per_forward", "draft_ms_per_forward", "other_ms_per_forward",
              "loop_ms_per_step"]
    pd.testing.assert_frame_equal(first.drop(columns=timing), third.drop(columns=timing))


def test_a_folder_of_another_run_is_refused_unless_fresh(tmp_path):
    runner, _ = _bench(tmp_path, ["vanilla"])
    other = EngineConfig().with_overrides({"max_new_tokens": 5})
    with pytest.raises(RespecError, match="another run"):
        run_bench(runner, QUESTIONS, ["vanilla"], other, tmp_path / "out", progress=False)
    summary = run_bench(runner, QUESTIONS, ["vanilla"], other, tmp_path / "out", progress=False, fresh=True)
    assert summary[summary.category == "overall"].iloc[0].questions == len(QUESTIONS)


# ------------------------------------------------------------------------------- sweeps
from respec.lab.sweep import best_point, pareto_front, parse_grid, run_sweep  # noqa: E402


def test_a_grid_parses_with_aliases_in_the_order_given():
    g = parse_grid(" theta_H=0.5, 1 ,1.5 ; alpha=0.1,0.3;tree.depth=3")
    assert g.keys == ("trigger.theta_entropy", "candidates.alpha", "tree.depth")
    assert g.values == ((0.5, 1, 1.5), (0.1, 0.3), (3,)) and len(g.points()) == 6
    assert g.points()[1] == {"trigger.theta_entropy": 0.5, "candidates.alpha": 0.3, "tree.depth": 3}


@pytest.mark.parametrize("text,needle", [
    ("", "empty"), (" ; ", "empty"), ("theta_H", "key=v1,v2"), ("=1,2", "key=v1,v2"), ("theta_H=", "no values"),
    ("theta_H=1;theta_H=2", "appears twice"), ("nonsense=1,2", "unknown setting"), ("theta_H=-1", "must be in"),
    ("theta_H=abc", "must be a number"), ("alpha=0.1,nan", "finite"), ("method=sam,respec", "not a grid key"),
    ("theta_H=" + ",".join(str(i) for i in range(11)) + ";alpha=" + ",".join(f"0.{i}" for i in range(10)) + ",1",
     "at most 100"),
])
def test_bad_grids_are_refused_with_a_clear_error(text, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_grid(text)


def test_pareto_front_and_best_point_on_hand_made_rows():
    rows = [{"speedup_vs_vanilla": 1.2, "nll_ratio": 1.00}, {"speedup_vs_vanilla": 1.5, "nll_ratio": 1.04},
            {"speedup_vs_vanilla": 1.4, "nll_ratio": 1.10}, {"speedup_vs_vanilla": 1.8, "nll_ratio": 1.20},
            {"speedup_vs_vanilla": 1.1, "nll_ratio": 1.02}]
    assert pareto_front(rows, "nll_ratio") == [True, True, False, True, False]
    assert best_point(rows, "nll_ratio", 1.05) is rows[1] and best_point(rows, "nll_ratio", 0.5) is None
    strict = [{"speedup_vs_vanilla": 1.3, "exact_match_rate": 1.0}, {"speedup_vs_vanilla": 1.6, "exact_match_rate": 0.5}]
    assert pareto_front(strict, "exact_match_rate") == [True, True]
    assert best_point(strict, "exact_match_rate", 1.0) is strict[0]


def test_a_2d_sweep_writes_table_and_heatmap_and_resumes(tmp_path, monkeypatch):
    runner = tiny_runner("qwen2", seed=4)
    base = EngineConfig().with_overrides({"max_new_tokens": 10, "tree.total_tokens": 8, "tree.depth": 3,
                                          "tree.top_k": 3, "candidates.min_match": 2})
    grid = parse_grid("theta_H=0.5,20;L_max=4,16", base)
    rows = run_sweep(runner, QUESTIONS[:2], "respec-strict", base, grid, tmp_path / "sw", progress=False)
    assert len(rows) == 4 and any(r["pareto"] for r in rows)
    assert all(r["exact_match_rate"] == 1.0 for r in rows), "respec-strict is lossless at every point"
    assert {(r["trigger.theta_entropy"], r["candidates.l_max"]) for r in rows} == {(0.5, 4), (0.5, 16), (20, 4), (20, 16)}
    csv = pd.read_csv(tmp_path / "sw" / "sweep.csv")
    assert list(csv.columns[:2]) == ["trigger.theta_entropy", "candidates.l_max"] and "pareto" in csv
    assert "Pareto front" in (tmp_path / "sw" / "heatmap.html").read_text()
    import respec.lab.sweep as sweep
    calls = []
    real = sweep.run_question
    monkeypatch.setattr(sweep, "run_question", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = run_sweep(runner, QUESTIONS[:2], "respec-strict", base, grid, tmp_path / "sw", progress=False)
    assert calls == [] and [r["exact_match_rate"] for r in again] == [r["exact_match_rate"] for r in rows]
    with pytest.raises(RespecError, match="another run"):
        run_sweep(runner, QUESTIONS[:2], "respec-strict", base, parse_grid("theta_H=1", base), tmp_path / "sw",
                  progress=False)


def test_a_sweep_runs_each_questions_points_back_to_back_and_repeats(tmp_path, monkeypatch):
    """Per repeat and question: vanilla, then every point (a drift of the machine moves them
    together); every record is compared to the vanilla run of its own question and repeat; a larger
    --repeats resumes, adding only the missing repeats."""
    import respec.lab.sweep as sweep
    runner = tiny_runner("qwen2", seed=4)
    base = EngineConfig().with_overrides({"max_new_tokens": 8, "tree.total_tokens": 8, "tree.depth": 3,
                                          "tree.top_k": 3})
    grid = parse_grid("tree.total_tokens=4,8", base)
    rows = run_sweep(runner, QUESTIONS[:2], "eagle2", base, grid, tmp_path / "sw", progress=False, repeats=2)
    recs = [json.loads(line) for line in (tmp_path / "sw" / "sweep_results.jsonl").read_text().splitlines()]
    order = [(r["repeat"], r["question_id"], r["point"]) for r in recs]
    qids = [q.question_id for q in QUESTIONS[:2]]
    pids = ["vanilla"] + [sweep.point_id(p) for p in grid.points()]
    assert order == [(k, q, p) for k in range(2) for q in qids for p in pids]
    assert all(r["matches_vanilla"] for r in recs), "eagle2 is lossless against its own repeat's vanilla"
    assert len(rows) == 2 and all(r["questions"] == 2 for r in rows)
    calls = []
    real = sweep.run_question
    monkeypatch.setattr(sweep, "run_question", lambda *a, **k: calls.append(1) or real(*a, **k))
    run_sweep(runner, QUESTIONS[:2], "eagle2", base, grid, tmp_path / "sw", progress=False, repeats=3)
    assert len(calls) == 2 * 3, "only repeat 2: vanilla and two points for each of two questions"
    with pytest.raises(ConfigError, match="repeats"):
        run_sweep(runner, QUESTIONS[:2], "eagle2", base, grid, tmp_path / "sw2", progress=False, repeats=0)


# ------------------------------------------------------------------------------- repeats
def test_summary_spread_over_repeats_on_hand_made_records():
    records = []
    # vanilla 10 tok/s in both repeats; sam 20 then 30 tok/s -> per-repeat speedups 2.0 and 3.0
    for k, sam_wall in ((0, 0.5), (1, 1 / 3)):
        for qid in (1, 2):
            records.append({**_rec(qid, "qa", "vanilla", new=10, wall=1.0, steps=9, committed=9), "repeat": k})
            records.append({**_rec(qid, "qa", "sam", new=10, wall=sam_wall, steps=3, committed=9), "repeat": k})
    s = summarize(pd.DataFrame(records)).set_index(["category", "method"])
    row = s.loc[("qa", "sam")]
    assert row.questions == 2 and row.repeats == 2, "questions are counted once, however often they ran"
    assert row.tokens_per_s == pytest.approx(25.0) and row.speedup_vs_vanilla == pytest.approx(2.5)
    assert (row.speedup_min, row.speedup_max) == (pytest.approx(2.0), pytest.approx(3.0))
    assert row.speedup_std == pytest.approx(0.70710678), "sample std of 2.0 and 3.0"
    one = summarize(pd.DataFrame([r for r in records if r["repeat"] == 0])).set_index(["category", "method"])
    assert one.loc[("qa", "sam")].repeats == 1 and one.loc[("qa", "sam")].speedup_std != one.loc[("qa", "sam")].speedup_std
    assert "±0.71 [2.00–3.00]" in summary_table_markdown(s.reset_index())
    assert "±" not in summary_table_markdown(one.reset_index()), "one repeat: no spread column"


def test_repeats_add_records_and_a_larger_n_resumes(tmp_path, monkeypatch):
    runner, summary = _bench(tmp_path, ["vanilla", "sam"], repeats=2)
    path = tmp_path / "out" / "results.jsonl"
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    assert sorted((r["question_id"], r["method"], r["repeat"]) for r in recs) == sorted(
        (q.question_id, m, k) for q in QUESTIONS for m in ("vanilla", "sam") for k in (0, 1))
    assert all(r["matches_vanilla"] for r in recs)
    overall = summary[(summary.category == "overall") & (summary.method == "sam")].iloc[0]
    assert overall.repeats == 2 and overall.questions == len(QUESTIONS)
    assert 0 < overall.speedup_min <= overall.speedup_max and overall.speedup_std == overall.speedup_std
    csv = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert {"speedup_std", "speedup_min", "speedup_max", "repeats"} <= set(csv.columns)
    import respec.lab.bench as bench
    calls = []
    real = bench.run_question
    monkeypatch.setattr(bench, "run_question", lambda *a, **k: calls.append(a[1].question_id) or real(*a, **k))
    _bench(tmp_path, ["vanilla", "sam"], repeats=2)
    assert calls == [], "every repeat was finished: nothing reruns"
    _, three = _bench(tmp_path, ["vanilla", "sam"], repeats=3)
    assert len(calls) == 2 * len(QUESTIONS), "only repeat 2 runs"
    assert three[(three.category == "overall") & (three.method == "sam")].iloc[0].repeats == 3
    with pytest.raises(ConfigError, match="repeats"):
        _bench(tmp_path, ["vanilla"], repeats=0)


def test_an_older_run_without_repeat_or_relax_mode_resumes(tmp_path, monkeypatch):
    _bench(tmp_path, ["vanilla"])
    path = tmp_path / "out" / "results.jsonl"
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "repeat"}) + "\n" for r in recs))
    run_file = tmp_path / "out" / "run.json"
    identity = json.loads(run_file.read_text())
    del identity["config"]["relax"]["mode"]              # written before relax.mode existed
    run_file.write_text(json.dumps(identity))
    import respec.lab.bench as bench
    calls = []
    real = bench.run_question
    monkeypatch.setattr(bench, "run_question", lambda *a, **k: calls.append(1) or real(*a, **k))
    _bench(tmp_path, ["vanilla"])
    assert calls == []


def test_decode_only_speed_leaves_each_records_prefill_out():
    """decode_tokens_per_s: new tokens over (wall - prefill) per record, averaged; decode_speedup:
    its ratio to vanilla's; the matrix shows it where it differs from the Spec-Bench speedup."""
    from respec.lab.report import speedup_matrix_markdown
    van = [{**_rec(q, "qa", "vanilla", new=10, wall=wall, steps=9, committed=9),
            "totals": {"wall_ms": wall * 1000, "prefill_ms": 600.0}} for q, wall in ((1, 1.0), (2, 2.0))]
    sam = [{**_rec(q, "qa", "sam", new=10, wall=wall, steps=3, committed=9),
            "totals": {"wall_ms": wall * 1000, "prefill_ms": 600.0}} for q, wall in ((1, 0.8), (2, 1.0))]
    peer = _rec(1, "qa", "hf-greedy", new=10, wall=1.0, steps=10, committed=10)      # no engine totals
    summary = summarize(pd.DataFrame(van + sam + [peer]))
    s = summary.set_index(["category", "method"])
    assert s.loc[("qa", "vanilla")].decode_tokens_per_s == pytest.approx((10 / 0.4 + 10 / 1.4) / 2)
    assert s.loc[("qa", "sam")].decode_tokens_per_s == pytest.approx((10 / 0.2 + 10 / 0.4) / 2)
    assert s.loc[("qa", "sam")].decode_speedup == pytest.approx(37.5 / ((25 + 10 / 1.4) / 2))
    assert s.loc[("qa", "sam")].speedup_vs_vanilla == pytest.approx(((12.5 + 10) / 2) / ((10 + 5) / 2))
    assert s.loc[("qa", "vanilla")].decode_speedup == 1.0
    hf = s.loc[("qa", "hf-greedy")]
    assert hf.decode_tokens_per_s != hf.decode_tokens_per_s and hf.decode_speedup != hf.decode_speedup
    assert f"· decode {s.loc[('qa', 'sam')].decode_speedup:.2f}x" in speedup_matrix_markdown(summary)


def test_summary_carries_acceptance_by_depth_and_the_speedup_factors():
    van = {**_rec(1, "qa", "vanilla", new=10, wall=1.0, steps=9, committed=9),
           "depth": {}, "totals": {"tokens": 10, "forwards": 10, "wall_ms": 1000.0, "verify_ms": 900.0}}
    sam = {**_rec(1, "qa", "sam", new=10, wall=0.5, steps=3, committed=9),
           "depth": {"reached": {"retrieval": [3, 2]}, "accepted": {"retrieval": [2, 1]}, "relaxed": {},
                     "steps_reaching": [2, 1], "drafting_steps": {"retrieval": 3}, "held": {"retrieval": 3}},
           "totals": {"tokens": 10, "forwards": 4, "wall_ms": 500.0, "prefill_ms": 20.0, "verify_ms": 300.0,
                      "draft_ms": 50.0, "planned_steps": 3, "predicted_tokens": 7.5, "realised_tokens": 9}}
    old = _rec(2, "qa", "sam", new=10, wall=0.5, steps=3, committed=9)          # predates the fields
    s = summarize(pd.DataFrame([van, sam])).set_index(["category", "method"]).loc[("qa", "sam")]
    assert s.accept_at_depth_1 == pytest.approx(2 / 3) and s.accept_at_depth_2 == pytest.approx(1 / 2)
    assert s.accept_at_depth_3 != s.accept_at_depth_3, "no draft token reached depth 3: NaN"
    assert s.reach_depth_1 == pytest.approx(2 / 3)
    assert s.tokens_per_forward == pytest.approx(2.5) and s.step_cost == pytest.approx(125 / 100)
    assert s.tokens_per_forward / s.step_cost == pytest.approx(s.speedup_vs_vanilla)
    assert s.verify_ms_per_forward == pytest.approx(75.0) and s.draft_ms_per_forward == pytest.approx(12.5)
    assert s.other_ms_per_forward == pytest.approx(125 - 75 - 12.5)
    # the loop's own work per step, the prefill apart: (500 - 20 - 300 - 50) ms over 3 steps
    assert s.loop_ms_per_step == pytest.approx((500 - 20 - 300 - 50) / 3)
    v = summarize(pd.DataFrame([van, sam])).set_index(["category", "method"]).loc[("qa", "vanilla")]
    assert v.loop_ms_per_step == pytest.approx((1000 - 900) / 9), "vanilla's too, over its own steps"
    assert s.predicted_tokens == pytest.approx(2.5) and s.realised_tokens == pytest.approx(3.0)
    legacy = summarize(pd.DataFrame([van, old])).set_index(["category", "method"]).loc[("qa", "sam")]
    assert legacy.tokens_per_forward != legacy.tokens_per_forward, "records without the fields: NaN"
    assert "accept_at_depth_1" in summary_table_markdown(summarize(pd.DataFrame([van, sam])))


def test_a_peers_wall_time_waits_on_every_gpu_holding_weights(monkeypatch):
    """hf-greedy / hf-pld time `model.generate` up to a barrier on every device of
    `target.weight_devices` (issue 30 §8: a model split over two GPUs finishes on the second)."""
    import torch

    from respec.lab.bench import hf_generate

    runner = tiny_runner("qwen2", seed=4)
    two = (torch.device("cuda", 0), torch.device("cuda", 1))
    monkeypatch.setattr(type(runner.target), "weight_devices", property(lambda self: two))
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda dev=None: waited.append(dev))
    ids = runner.encode([{"role": "user", "content": "w1 w2 w3"}])
    new, wall, forwards = hf_generate(runner, ids, "hf-greedy", 4)
    assert waited == list(two) and len(new) >= 1 and wall > 0 and forwards >= 1
