"""The Lab tab's handler on the tiny model: request validation and bounds, a methods run and a 2-D
grid streaming partial results, CSV export, and Stop ending the worker with the model free."""
import json

import pytest

from app.events.lab import LabRequest, lab_stream, plan
from respec.errors import ConfigError
from tests.test_app_render import CAPS, tiny_hub


@pytest.fixture()
def qfile(tmp_path):
    rows = [{"question_id": 1, "category": "qa", "turns": ["w5 w6 w7 w8 w5 w6 w7"]},
            {"question_id": 2, "category": "summarization", "turns": ["w9 w10 w11 w9 w10 w11 w9"]},
            {"question_id": 3, "category": "qa", "turns": ["w12 w13 w12 w13", "w14 w15"]}]
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def _req(qfile, **kw):
    base = dict(mode="methods", categories=("qa", "summarization"), per_category=2, max_new_tokens=8,
                methods=("vanilla", "sam", "hf-pld"), questions_file=qfile,
                settings={"sam.len_threshold": 2, "tree.auto": False, "tree.total_tokens": 8, "tree.depth": 3,
                          "tree.top_k": 3})
    base.update(kw)
    return LabRequest(**base)


@pytest.mark.parametrize("kw,needle", [
    ({"categories": ()}, "at least one category"), ({"categories": ("poetry",)}, "unknown categories"),
    ({"per_category": 0}, "between 1 and 20"), ({"max_new_tokens": 10_000}, "RESPEC_MAX_NEW_TOKENS"),
    ({"methods": ("vanilla", "medusa")}, "unknown method"), ({"mode": "grid", "grid": ""}, "grid is empty"),
    ({"mode": "grid", "grid": "theta_H=1;alpha=0.1;L_max=4"}, "at most two"),
    ({"mode": "grid", "grid": "theta_H=1", "grid_method": "vanilla"}, "speculative method"),
    ({"per_category": 20, "max_new_tokens": 64}, "RESPEC_LAB_BUDGET"),
    ({"questions_file": "/nonexistent/q.jsonl"}, "not found"),
])
def test_bad_lab_requests_are_refused_before_any_work(qfile, kw, needle, monkeypatch):
    monkeypatch.setenv("RESPEC_LAB_BUDGET", "200")
    with pytest.raises(Exception) as err:
        plan(_req(qfile, **kw), CAPS)
    assert needle in str(err.value)
    hub = tiny_hub()
    updates = list(lab_stream(hub, CAPS, _req(qfile, **kw)))
    assert len(updates) == 1 and updates[0]["status"].startswith("⚠") and needle in updates[0]["status"]


def test_a_methods_run_streams_partial_tables_and_exports_csv(qfile):
    updates = list(lab_stream(tiny_hub(), CAPS, _req(qfile)))
    tables = [u["table"] for u in updates if "table" in u]
    assert len(tables) >= 2, "partial results stream in as records finish"
    final = tables[-1]
    overall = final[final.category == "overall"].set_index("method")
    assert set(overall.index) == {"vanilla", "sam", "hf-pld"} and (overall.exact_match_rate == 1.0).all()
    assert updates[-1]["status"].startswith("✔ Lab done: 9 runs")
    csv = updates[-1]["download"]
    assert csv.endswith("summary.csv") and "speedup_vs_vanilla" in open(csv).read()


def test_a_grid_run_streams_a_heatmap(qfile):
    req = _req(qfile, mode="grid", grid_method="respec-strict", grid="theta_H=0.5,20;L_max=4,16",
               categories=("qa",), per_category=1)
    updates = list(lab_stream(tiny_hub(), CAPS, req))
    assert updates[-1]["status"].startswith("✔ Lab done: 5 runs")
    final = [u for u in updates if "table" in u][-1]["table"]
    assert len(final) == 4 and "pareto" in final and (final.exact_match_rate == 1.0).all()
    plots = [u["plot"] for u in updates if "plot" in u]
    assert any(t.type == "heatmap" for t in plots[-1].data)
    assert updates[-1]["download"].endswith("sweep.csv")


def test_stop_ends_the_worker_after_its_record_and_frees_the_model(qfile):
    hub = tiny_hub()
    gen = lab_stream(hub, CAPS, _req(qfile))
    first = next(gen)
    assert first["status"].startswith("▶ Lab")
    next(gen)                                           # one record in
    gen.close()                                         # Stop / closed tab
    assert hub._step_lock.acquire(timeout=5), "the worker has let go of the model"
    hub._step_lock.release()
    import threading
    assert not any(t.name == "respec-lab" for t in threading.enumerate()), "no Lab worker left running"


@pytest.mark.parametrize("global_cache", [True, False])
def test_suffix_decodings_global_cache_carries_from_one_lab_question_to_the_next(tmp_path, global_cache):
    """Two questions with one text in a Lab run: with suffix.global_cache the second drafts from the
    first's answer (fewer target forwards); without it both take the same steps."""
    from pathlib import Path

    from respec.drafters.suffix import suffix_library
    if suffix_library()[0] is None:
        pytest.skip("arctic-inference is not built here")
    text = "w5 w17 w33 w9 w71 w4 w88 w12 " * 3
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps({"question_id": i, "category": "qa", "turns": [text]}) + "\n" for i in (1, 2)))
    req = _req(str(path), categories=("qa",), methods=("vanilla", "suffix"), max_new_tokens=32,
               settings={"tree.auto": False, "suffix.global_cache": global_cache})
    updates = list(lab_stream(tiny_hub(), CAPS, req))
    assert updates[-1]["status"].startswith("✔ Lab done: 4 runs"), updates[-1]["status"]
    recs = [json.loads(x) for x in (Path(updates[-1]["download"]).parent / "results.jsonl").read_text().splitlines()]
    first, second = sorted((r for r in recs if r["method"] == "suffix"), key=lambda r: r["question_id"])
    assert first["tokens"] == second["tokens"] and first["matches_vanilla"] and second["matches_vanilla"]
    assert (second["steps"] < first["steps"]) if global_cache else (second["steps"] == first["steps"])
