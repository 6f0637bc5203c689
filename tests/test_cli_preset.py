"""`--preset paper` in generate, bench and sweep: one definition (respec.config.PRESETS) applied
instead of the device defaults, user --set still winning, recorded in the trace's config; an
unknown preset fails before any model loads. `bench --repeats N` through the CLI. The model loader
is replaced by a tiny float64 model with a word-level tokenizer (tests/test_app_render.py)."""
import json

import pandas as pd
import pytest

from respec import cli
from respec.config import PRESETS, EngineConfig, device_defaults
from tests.test_app_render import tiny_runner

PAPER = {"trigger.theta_entropy": 1.5, "trigger.window": 3, "candidates.min_match": 3, "candidates.l_max": 16,
         "candidates.s0": 0.5, "candidates.theta_score": 0.5, "tree.total_tokens": 60, "tree.depth": 5,
         "tree.top_k": 10, "tree.auto": False, "candidates.tree_budget": 60, "sam.n_predicts": 40}


def _get(cfg: EngineConfig, key: str):
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name)


def test_the_paper_preset_holds_the_papers_values_and_replaces_every_device_default():
    for key, value in PAPER.items():
        assert PRESETS["paper"][key] == value, key
    for device in ("cpu", "cuda"):
        assert set(device_defaults(device)) <= set(PRESETS["paper"]), \
            "a device default the preset does not set would leak into paper mode"
    assert EngineConfig().with_overrides(PRESETS["paper"]) == EngineConfig(), "the paper values are the engine's own"


@pytest.fixture
def tiny_cli(monkeypatch):
    runner = tiny_runner("llama", seed=3)
    monkeypatch.setattr(cli, "_runner", lambda args: runner)
    return runner


def test_generate_with_the_paper_preset_records_the_paper_values(tiny_cli, tmp_path, capsys):
    trace = tmp_path / "T.json"
    rc = cli.main(["generate", "--prompt", "w5 w6 w7 w5 w6", "--no-chat", "--method", "respec", "--preset", "paper",
                   "--max-new-tokens", "4", "--set", "relax.mode=shift", "--trace", str(trace)])
    assert rc == 0, capsys.readouterr().err
    data = json.loads(trace.read_text())
    cfg = EngineConfig.from_dict(data["config"])
    for key, value in PAPER.items():
        assert _get(cfg, key) == value, f"{key} in the trace's config"
    assert cfg.relax.mode == "shift" and data["meta"]["preset"] == "paper"


def test_set_wins_over_the_preset_and_no_preset_keeps_the_device_defaults(tiny_cli, tmp_path):
    trace = tmp_path / "T.json"
    assert cli.main(["generate", "--prompt", "w5 w6", "--no-chat", "--method", "eagle2", "--preset", "paper",
                     "--max-new-tokens", "2", "--set", "theta_H=2", "--set", "tree.depth=3", "--trace", str(trace)]) == 0
    cfg = EngineConfig.from_dict(json.loads(trace.read_text())["config"])
    assert cfg.trigger.theta_entropy == 2 and cfg.tree.depth == 3 and cfg.tree.total_tokens == 60
    assert cli.main(["generate", "--prompt", "w5 w6", "--no-chat", "--method", "eagle2", "--max-new-tokens", "2",
                     "--trace", str(trace)]) == 0
    data = json.loads(trace.read_text())
    cfg = EngineConfig.from_dict(data["config"])
    assert cfg.tree.total_tokens == 16 and cfg.tree.auto is True and cfg.trigger.theta_entropy == 3.0
    assert data["meta"]["preset"] == "device"


def test_an_unknown_preset_fails_before_the_model_loads(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "_runner", lambda args: pytest.fail("the model must not load"))
    for argv in (["generate", "--prompt", "hi", "--preset", "fast"],
                 ["bench", "--questions", "x.jsonl", "--out", str(tmp_path / "o"), "--preset", "fast"],
                 ["sweep", "--questions", "x.jsonl", "--grid", "theta_H=1", "--out", str(tmp_path / "o"),
                  "--preset", "fast"]):
        assert cli.main(argv) == 2
        assert "unknown preset 'fast'; choose one of device, paper" in capsys.readouterr().err
    assert cli.main(["bench", "--questions", "x.jsonl", "--out", str(tmp_path / "o"), "--repeats", "0"]) == 2
    assert "--repeats must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def _questions(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["w5 w6 w7 w5 w6"]}) + "\n"
                 + json.dumps({"question_id": 2, "category": "rag", "turns": ["w9 w10 w9"]}) + "\n")
    return q


def test_bench_with_the_paper_preset_and_two_repeats_writes_a_spread(tiny_cli, tmp_path, capsys):
    out = tmp_path / "out"
    rc = cli.main(["bench", "--questions", str(_questions(tmp_path)), "--methods", "respec-strict", "--preset", "paper",
                   "--repeats", "2", "--max-new-tokens", "4", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    cfg = EngineConfig.from_dict(json.loads((out / "run.json").read_text())["config"])
    for key, value in PAPER.items():
        assert _get(cfg, key) == value, f"{key} in run.json"
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert sorted((r["question_id"], r["method"], r["repeat"]) for r in recs) == sorted(
        (q, m, k) for q in (1, 2) for m in ("vanilla", "respec-strict") for k in (0, 1))
    summary = pd.read_csv(out / "summary.csv")
    assert {"repeats", "speedup_std", "speedup_min", "speedup_max"} <= set(summary.columns)
    row = summary[(summary.category == "overall") & (summary.method == "respec-strict")].iloc[0]
    assert row.repeats == 2 and row.questions == 2
    assert row.speedup_min <= row.speedup_max and row.speedup_std >= 0
    assert "±" in (out / "summary.md").read_text()


def test_sweep_takes_the_preset(tiny_cli, tmp_path, monkeypatch):
    import respec.lab.sweep as sweep
    seen = {}

    def fake_run_sweep(runner, questions, method, base, grid, out_dir, **kw):
        seen["base"], seen["grid"] = base, grid
        return []
    monkeypatch.setattr(sweep, "run_sweep", fake_run_sweep)
    assert cli.main(["sweep", "--questions", str(_questions(tmp_path)), "--method", "respec", "--preset", "paper",
                     "--grid", "relax.mode=lookahead,fly;theta_H=1,2", "--out", str(tmp_path / "sw")]) == 0
    for key, value in PAPER.items():
        assert _get(seen["base"], key) == value, key
    assert seen["grid"].values == (("lookahead", "fly"), (1, 2)), "a grid may sweep relax.mode by name"
