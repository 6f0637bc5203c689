"""The "Lab" tab: Spec-Bench runs and 2-D threshold sweeps from the browser.

Contract: `lab_stream(hub, caps, request, session_dir)` is a generator over dicts keyed by the Lab's
output names (status, table, plot, download). It validates the request first (questions file,
categories, counts, methods or grid, the deployment's budget of question x method x token units;
every RespecError becomes a status message), then runs `respec.lab.bench.run_bench` or
`respec.lab.sweep.run_sweep` in a worker thread and streams each finished record into the table and
the chart. Closing the generator (Stop, a closed tab, the time limit) tells the worker to stop
after the record it is on; so does `should_stop()` turning true (the Lab's Stop flag, which reaches a
ZeroGPU worker where closing the main process's generator may not), and the stream then ends with a
stopped status. The questions come from an uploaded Spec-Bench JSONL or from the dev
split at RESPEC_QUESTIONS / ../shared/spec_bench/question_dev.jsonl (never copied into the project).
"""
from __future__ import annotations

import os
import queue
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from app.session.settings import build_config, env_int
from app.views import figures
from app.views.anatomy_view import waterfall_traces
from respec.config import EngineConfig
from respec.errors import ConfigError, RespecError
from respec.lab.bench import CATEGORIES, load_questions, parse_bench_methods, run_bench, summarize
from respec.lab.sweep import heatmap_figure, parse_grid, quality_metric, run_sweep, sweep_rows

LAB_STOPPED = "■ Lab stopped."

#: Work units a Lab run may take: questions x methods (or grid points + vanilla) x max new tokens.
DEFAULT_BUDGET = 12_000


def default_questions_path() -> Path | None:
    env = os.environ.get("RESPEC_QUESTIONS", "").strip()
    if env:
        return Path(env)
    p = Path(__file__).resolve().parents[3] / "shared" / "spec_bench" / "question_dev.jsonl"
    return p if p.is_file() else None


def lab_budget() -> int:
    return env_int("RESPEC_LAB_BUDGET", DEFAULT_BUDGET)


@dataclass(frozen=True)
class LabRequest:
    mode: str                        # "methods" | "grid"
    categories: tuple[str, ...]
    per_category: int
    max_new_tokens: int
    methods: tuple[str, ...] = ()    # mode "methods"
    grid_method: str = "respec"      # mode "grid"
    grid: str = ""
    questions_file: str | None = None
    settings: dict | None = None     # extra engine settings (the page's current values)


@dataclass(frozen=True)
class LabPlan:
    questions: list                  # respec.lab.bench.Question
    what: Any                        # methods (vanilla first), or (method, Grid)
    runs: int                        # runs per question: methods, or grid points + vanilla
    units: int                       # turns x runs x max new tokens (the budgeted quantity)


def plan(req: LabRequest, caps, budget: int | None = None) -> LabPlan:
    """Validate a request -> LabPlan. Raises RespecError."""

    budget = budget or lab_budget()
    if req.mode not in ("methods", "grid"):
        raise ConfigError(f"unknown Lab mode {req.mode!r}")
    path = Path(req.questions_file) if req.questions_file else default_questions_path()
    if path is None:
        raise RespecError("no Spec-Bench questions here: upload a question JSONL (Spec-Bench format) "
                          "or set RESPEC_QUESTIONS")
    cats = [c for c in req.categories if c]
    if not cats:
        raise ConfigError("pick at least one category")
    bad = [c for c in cats if c not in CATEGORIES]
    if bad:
        raise ConfigError(f"unknown categories {bad}; choose from {', '.join(CATEGORIES)}")
    if not isinstance(req.per_category, (int, float)) or not 1 <= int(req.per_category) <= 20:
        raise ConfigError("questions per category must be between 1 and 20")
    if not isinstance(req.max_new_tokens, (int, float)) or not 4 <= int(req.max_new_tokens) <= caps.max_new_tokens:
        raise ConfigError(f"max new tokens must be between 4 and {caps.max_new_tokens} (RESPEC_MAX_NEW_TOKENS)")
    questions = load_questions(path, cats, int(req.per_category))
    turns = sum(len(q.turns) for q in questions)
    if req.mode == "methods":
        methods = parse_bench_methods(list(req.methods) or ["vanilla"])
        what: Any = ["vanilla"] + [m for m in methods if m != "vanilla"]
        runs = len(what)
    else:
        grid = parse_grid(req.grid, EngineConfig().with_overrides(dict(req.settings or {})))
        if len(grid.keys) > 2:
            raise ConfigError("the Lab sweeps at most two settings at once (the CLI `sweep` takes more)")
        if req.grid_method == "vanilla":
            raise ConfigError("sweep a speculative method (vanilla is the reference)")
        runs = len(grid.points()) + 1
        what = (req.grid_method, grid)
    units = turns * runs * int(req.max_new_tokens)
    if units > budget:
        raise ConfigError(f"this run is {turns} turns x {runs} runs x {int(req.max_new_tokens)} tokens = {units:,} "
                          f"units; this deployment allows {budget:,} (RESPEC_LAB_BUDGET). Pick fewer questions, "
                          f"methods or grid values, or fewer tokens.")
    return LabPlan(questions, what, runs, units)


def lab_stream(hub, caps, req: LabRequest, session_dir: str | None = None,
               should_stop: Callable[[], bool] = lambda: False) -> Iterator[dict[str, Any]]:
    """Run a Lab request, yielding {"status", "table", "plot", "download"} updates; `should_stop`
    (polled between records) ends it early."""
    import pandas as pd


    # 1. Validate before touching the model.
    try:
        p = plan(req, caps)
        runner = hub.runner()
        base = build_config(dict(req.settings or {}) | {"max_new_tokens": int(req.max_new_tokens)}, "vanilla",
                            hub.device(), caps)
    except RespecError as exc:
        yield {"status": f"⚠ {exc}"}
        return
    out_dir = Path(tempfile.mkdtemp(prefix="lab-", dir=session_dir))
    questions, what, units = p.questions, p.what, p.units
    total = len(questions) * p.runs
    records: "queue.Queue[dict]" = queue.Queue()
    stop = threading.Event()
    failure: list[BaseException] = []

    def work():
        try:
            if req.mode == "methods":
                run_bench(runner, questions, list(what), base, out_dir, progress=False, fresh=True,
                          on_record=records.put, should_stop=stop.is_set, guard=hub.exclusive)
            else:
                method, grid = what
                run_sweep(runner, questions, method, base, grid, out_dir, progress=False, fresh=True,
                          on_record=records.put, should_stop=stop.is_set, guard=hub.exclusive)
        except BaseException as exc:  # noqa: BLE001 - reported in the page
            failure.append(exc)

    # 2. The run, in a worker; each finished record refreshes the table and the chart.
    worker = threading.Thread(target=work, name="respec-lab", daemon=True)
    done: list[dict] = []
    t0 = time.perf_counter()
    yield {"status": f"▶ Lab: {total} runs ({units:,} work units)…", "download": None}
    worker.start()
    try:
        while worker.is_alive() or not records.empty():
            if should_stop():
                stop.set()
                break
            try:
                done.append(records.get(timeout=0.5))
            except queue.Empty:
                continue
            while not records.empty():
                done.append(records.get_nowait())
            df = pd.DataFrame(done)
            table, plot = _views(df, req, what, base)
            yield {"status": f"▶ Lab: {len(done)}/{total} runs, {time.perf_counter() - t0:.0f} s", "table": table,
                   "plot": plot}
    finally:
        stop.set()                                   # a closed generator (Stop / tab closed) ends the worker
        worker.join()                                # after the record it is on (it holds the model)
    if should_stop():
        yield {"status": f"{LAB_STOPPED} ({len(done)}/{total} runs)"}
        return
    if failure:
        exc = failure[0]
        msg = str(exc) if isinstance(exc, RespecError) else f"{type(exc).__name__}: {exc}"
        yield {"status": f"⚠ the Lab run failed: {msg}"}
        return
    csv = out_dir / ("summary.csv" if req.mode == "methods" else "sweep.csv")
    yield {"status": f"✔ Lab done: {len(done)} runs in {time.perf_counter() - t0:.0f} s", "download": str(csv)
           if csv.is_file() else None}


def _views(df, req: LabRequest, what, base):
    """(table, figure) for the records so far."""
    import pandas as pd
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots


    if df.empty or "vanilla" not in set(df.method):
        return pd.DataFrame(), figures.empty_figure("waiting for the first vanilla run", 420)
    if req.mode == "methods":
        s = summarize(df)
        cols = ["category", "method", "questions", "tokens_per_s", "speedup_vs_vanilla", "mean_accepted",
                "exact_match_rate", "lossless_rate", "nll_ratio", "trigger_rate", "retrieval_step_share",
                "accept_at_depth_1", "accept_at_depth_2", "accept_at_depth_3", "tokens_per_forward", "step_cost",
                "predicted_tokens", "realised_tokens"]
        table = s[[c for c in cols if c in s]].round(3)
        fig = make_subplots(rows=1, cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.1,
                            subplot_titles=("speedup over vanilla (so far)", "overall: tokens/forward × cost"))
        for method in dict.fromkeys(s.method):
            part = s[s.method == method]
            fig.add_trace(go.Bar(name=method, x=list(part.category), y=list(part.speedup_vs_vanilla)), row=1, col=1)
        overall = s[(s.category == "overall") & (s.method != "vanilla") & s.tokens_per_forward.notna()]
        for trace in waterfall_traces([(r.method, r.tokens_per_forward, r.tokens_per_forward / r.step_cost,
                                        None if r.predicted_tokens != r.predicted_tokens else r.predicted_tokens)
                                       for r in overall.itertuples()]):
            fig.add_trace(trace, row=1, col=2)
        fig.update_layout(barmode="group", template="plotly_white", height=420, yaxis_title="speedup")
        return table, fig
    method, grid = what
    quality = quality_metric(method, base)
    rows = sweep_rows(df[df.point.notna()] if "point" in df else df, grid, quality)
    if not rows:
        return pd.DataFrame(), figures.empty_figure("waiting for the first grid point", 420)
    table = pd.DataFrame(rows).round(3)
    return table, heatmap_figure(rows, grid, quality, method)


def lab_request(mode: str, categories: Sequence[str], per_category, max_new_tokens, methods: Sequence[str],
                grid_method: str, grid: str, upload, settings: dict | None) -> LabRequest:
    path = getattr(upload, "name", upload) if upload else None
    return LabRequest(mode="grid" if str(mode).startswith("2-D") else "methods", categories=tuple(categories or ()),
                      per_category=int(per_category or 0), max_new_tokens=int(max_new_tokens or 0),
                      methods=tuple(methods or ()), grid_method=grid_method or "respec", grid=grid or "",
                      questions_file=str(path) if path else None, settings=settings)
