"""Spec-Bench runner: question JSONL in, per-question records and a per-category summary out.

Contract (ALGORITHMS.md §6): greedy, batch 1, chat template of the target, multi-turn questions
run turn by turn (turn 2 follows the method's own turn-1 answer). MT-bench's eight subcategories are
grouped as `mt_bench`. Per question, method and repeat (`repeats` runs of everything, repeat 0
first; the record's `repeat` field, 0-based, absent in older files and read as 0) one record goes to
`DIR/results.jsonl` (appended and flushed as it completes, so an interrupted run keeps every
finished record); `DIR/summary.csv` is written at the end through a temporary file and an atomic
rename.

Metrics: per-question speed = new tokens / wall seconds; `tokens_per_s` is the mean of those;
`speedup_vs_vanilla` is a ratio of means over every repeat (Spec-Bench's speed.py); with several
repeats, `speedup_std` / `speedup_min` / `speedup_max` give the spread of the per-repeat speedups
(each repeat's mean tokens/s over vanilla's in the same repeat; sample std, NaN for one repeat);
`mean_accepted` = committed
tokens per target forward over all steps of all questions (includes the bonus token);
`exact_match_rate` = share of questions whose tokens equal vanilla's; `lossless_rate` = share that
equal vanilla or first diverge where vanilla's top-1/top-2 logit gap is within the rounding
tolerance of the model's dtype (0.5 in bf16/fp16, 1e-3 in fp32/fp64): see README "Lossless".
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from respec.config import EngineConfig, is_lossless
from respec.errors import ConfigError, RespecError

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")


def bench_category(category: str) -> str:
    return "mt_bench" if category in MT_BENCH else category


def gap_tolerance(dtype: str) -> float:
    """Largest vanilla top-1/top-2 logit gap at which a strict method may still diverge by rounding."""
    return 0.5 if ("bfloat16" in dtype or "float16" in dtype) else 1e-3


@dataclass(frozen=True)
class Question:
    question_id: int
    category: str          # the bench category (MT-bench subcategories -> "mt_bench")
    turns: tuple[str, ...]


def load_questions(path: str | Path, categories: Sequence[str] | None = None,
                   limit_per_category: int | None = None) -> list[Question]:
    path = Path(path)
    if not path.is_file():
        raise RespecError(f"questions file not found: {path}")
    out: list[Question] = []
    counts: dict[str, int] = {}
    wanted = None if not categories else set(categories)
    if wanted:
        unknown = wanted - set(CATEGORIES) - set(MT_BENCH)
        if unknown:
            raise ConfigError(f"unknown categories {sorted(unknown)}; choose from {', '.join(CATEGORIES)}")
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            q = Question(int(row["question_id"]), bench_category(str(row["category"])),
                         tuple(str(t) for t in row["turns"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise RespecError(f"{path}:{n}: not a Spec-Bench question ({exc})") from None
        if wanted and q.category not in wanted and row["category"] not in wanted:
            continue
        if limit_per_category is not None and counts.get(q.category, 0) >= limit_per_category:
            continue
        counts[q.category] = counts.get(q.category, 0) + 1
        out.append(q)
    if not out:
        raise RespecError(f"no questions selected from {path}")
    return out


def first_divergence(ref: Sequence[int], out: Sequence[int]) -> int | None:
    for i, (a, b) in enumerate(zip(ref, out)):
        if a != b:
            return i
    return None if len(ref) == len(out) else min(len(ref), len(out))


def rouge_l(ref: Sequence[int], out: Sequence[int]) -> float:
    """ROUGE-L F1 over token ids: longest common subsequence against the reference (vanilla)."""
    if not ref or not out:
        return float(len(ref) == len(out))
    prev = [0] * (len(out) + 1)
    for a in ref:
        cur = [0]
        for j, b in enumerate(out):
            cur.append(prev[j] + 1 if a == b else max(prev[j + 1], cur[j]))
        prev = cur
    lcs = prev[-1]
    if lcs == 0:
        return 0.0
    p, r = lcs / len(out), lcs / len(ref)
    return 2 * p * r / (p + r)


#: Peers measured in the same run: transformers' own greedy `generate` and prompt-lookup decoding.
PEERS: tuple[str, ...] = ("hf-greedy", "hf-pld")
PLD_TOKENS = 10                          # transformers' prompt_lookup_num_tokens for `hf-pld`


def parse_bench_methods(text: str | Sequence[str]) -> list[str]:
    """Engine methods and peers, in order, without duplicates. Raises ConfigError."""
    from respec.config import METHODS
    from respec.runner import parse_methods
    return parse_methods(text, METHODS + PEERS)


def _record(q: Question, method: str, *, new_tokens: int, wall: float, steps: int, committed: int,
            tokens: list[int], texts: list[str], hist: list[int], relaxed: int = 0, retrieval_steps: int = 0,
            fired: int = 0, nll: float | None = None, margins: list[float] | None = None,
            multi_chosen: int = 0, branching: int = 0) -> dict[str, Any]:
    rec = {"question_id": q.question_id, "category": q.category, "method": method,
           "new_tokens": new_tokens, "wall_s": wall, "tokens_per_s": new_tokens / wall if wall > 0 else 0.0,
           "steps": steps, "mean_accepted": committed / steps if steps else 1.0,
           "committed": committed, "relaxed_tokens": relaxed, "retrieval_steps": retrieval_steps,
           "trigger_fired": fired, "nll_per_token": nll, "accept_hist": hist,
           "multi_chosen_steps": multi_chosen, "branching_steps": branching,
           "text": "\n\n".join(texts), "tokens": tokens}
    if margins is not None:
        rec["margins"] = [round(float(m), 4) for m in margins]
    return rec


def _add_hist(total: list[int], part: Sequence[int]) -> None:
    total.extend([0] * (len(part) - len(total)))
    for i, n in enumerate(part):
        total[i] += n


def run_question(runner, q: Question, config: EngineConfig, score_nll: bool = False,
                 keep_margins: bool = False) -> dict[str, Any]:
    """All turns of one question with one engine method; returns a record (generated token ids
    kept for comparison; vanilla's logit margins with `keep_margins`). With `score_nll`, the
    output's negative log-likelihood under the target is measured per turn."""
    messages: list[dict] = []
    nll_sum, nll_n = 0.0, 0
    relaxed = retrieval_steps = fired = multi_chosen = branching = 0
    tokens: list[int] = []
    margins: list[float] = []
    texts: list[str] = []
    hist: list[int] = []
    new_tokens = steps = committed = 0
    wall = 0.0
    for turn in q.turns:
        messages.append({"role": "user", "content": turn})
        result = runner.generate(list(messages), config)
        messages.append({"role": "assistant", "content": result.text})
        texts.append(result.text)
        tokens.extend(result.tokens)
        margins.extend(result.token_margins())
        new_tokens += len(result.tokens)
        steps += len(result.steps)
        relaxed += sum(s.verdict.num_relaxed for s in result.steps)
        retrieval_steps += sum(1 for s in result.steps if s.source == "retrieval")
        fired += sum(1 for s in result.steps if s.decision is not None and s.decision.fired)
        for s in result.steps:          # retrieval steps that chose >= 2 candidates: did >= 2 reach the trie?
            chosen = [c for c in s.candidates if "draft" in c] if s.source == "retrieval" else []
            if len(chosen) >= 2:
                multi_chosen += 1
                branching += sum(1 for c in chosen if c.get("proposed", 0) > 0) >= 2
        _add_hist(hist, result.stats.accept_length_hist)
        if score_nll:
            total, n = runner.target.nll(result.prompt_tokens, result.tokens)
            nll_sum, nll_n = nll_sum + total, nll_n + n
        committed += sum(len(s.new_tokens) for s in result.steps)
        wall += result.wall_time_s
    return _record(q, config.method, new_tokens=new_tokens, wall=wall, steps=steps, committed=committed,
                   multi_chosen=multi_chosen, branching=branching,
                   tokens=tokens, texts=texts, hist=hist, relaxed=relaxed, retrieval_steps=retrieval_steps,
                   fired=fired, nll=nll_sum / nll_n if nll_n else None, margins=margins if keep_margins else None)


def hf_generate(runner, prompt_ids: Sequence[int], method: str, max_new_tokens: int) -> tuple[list[int], float, int]:
    """One greedy `model.generate` call of a peer: (new token ids, wall seconds incl. prefill,
    target forwards). Forwards are counted with a forward hook, so `hf-pld`'s mean accepted length
    is measured the same way as ours (tokens committed per forward after the prefill)."""
    import torch

    model, target = runner.target.model, runner.target
    eos = sorted(target.eos_token_ids)
    pad = target.pad_token_id
    kwargs = {"prompt_lookup_num_tokens": PLD_TOKENS} if method == "hf-pld" else {}
    calls = [0]
    hook = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        ids = torch.tensor([list(prompt_ids)], device=target.device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, temperature=None, top_p=None, top_k=None,
                                 eos_token_id=eos or None, pad_token_id=pad, **kwargs)
        if target.device.type == "cuda":
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    finally:
        hook.remove()
    return [int(t) for t in out[0, len(prompt_ids):].tolist()], wall, calls[0]


def run_peer_question(runner, q: Question, method: str, max_new_tokens: int) -> dict[str, Any]:
    """All turns of one question with a transformers peer (same prompts, chat template, lengths)."""
    messages: list[dict] = []
    tokens: list[int] = []
    texts: list[str] = []
    new_tokens = forwards = committed = 0
    wall = 0.0
    for turn in q.turns:
        messages.append({"role": "user", "content": turn})
        ids = runner.encode(list(messages))
        room = runner.target.context_length - len(ids)
        new, seconds, calls = hf_generate(runner, ids, method, min(max_new_tokens, room))
        text = runner.tokenizer.decode(new, skip_special_tokens=True) if runner.tokenizer is not None else ""
        messages.append({"role": "assistant", "content": text})
        texts.append(text)
        tokens.extend(new)
        new_tokens += len(new)
        forwards += max(0, calls - 1)                 # the prefill's forward chose the first token
        committed += max(0, len(new) - 1)
        wall += seconds
    return _record(q, method, new_tokens=new_tokens, wall=wall, steps=forwards, committed=committed,
                   tokens=tokens, texts=texts, hist=[])


RUN_FILE = "run.json"
RESULTS_FILE = "results.jsonl"


def _run_identity(runner, base: EngineConfig) -> dict[str, Any]:
    loaded = getattr(runner.target, "loaded", None)
    return {"model": getattr(loaded, "name", getattr(runner.target, "name", "model")),
            "dtype": str(runner.target.dtype), "device": str(runner.target.device),
            "eagle_head": getattr(runner, "head_info", None), "config": base.to_dict()}


def _with_current_defaults(identity: Any) -> Any:
    """An earlier run.json with its config completed by settings added since (e.g. relax.mode), so a
    folder written before a new setting existed still resumes when the run is otherwise the same."""
    try:
        return {**identity, "config": EngineConfig.from_dict(identity["config"]).to_dict()}
    except (RespecError, KeyError, TypeError):
        return identity


def _resume_records(out_dir: Path, identity: dict[str, Any], fresh: bool,
                    results_name: str = RESULTS_FILE) -> list[dict]:
    """Finished records of an earlier, identical run in out_dir (none with `fresh`). Raises
    RespecError when out_dir holds results of a different run (settings, model or head)."""
    results, run_file = out_dir / results_name, out_dir / RUN_FILE
    if fresh or not results.exists():
        return []
    try:
        earlier = json.loads(run_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        earlier = None
    if _with_current_defaults(earlier) != json.loads(json.dumps(identity, default=str)):
        raise RespecError(f"{out_dir} holds results of another run (other settings, model or EAGLE head); "
                          f"pass --fresh to start over there, or choose another --out")
    records = []
    for line in results.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue                                   # a line cut by an interruption: rerun it
        if isinstance(rec, dict) and "tokens" in rec and (rec["method"] != "vanilla" or "margins" in rec):
            records.append(rec)
    return records


def compare_to_vanilla(rec: dict, ref: dict, tol: float) -> dict:
    """Add matches_vanilla, first_divergence, divergence_gap, lossless, ROUGE-L and NLL ratio."""
    div = first_divergence(ref["tokens"], rec["tokens"])
    rec["matches_vanilla"] = div is None
    rec["first_divergence"] = div
    rec["divergence_gap"] = None if div is None or div >= len(ref["margins"]) else ref["margins"][div]
    rec["lossless"] = div is None or (rec["divergence_gap"] is not None and rec["divergence_gap"] <= tol)
    rec["rouge_l_vs_vanilla"] = rouge_l(ref["tokens"], rec["tokens"])
    rec["nll_ratio"] = (rec["nll_per_token"] / ref["nll_per_token"]
                        if rec["nll_per_token"] is not None and ref["nll_per_token"] else None)
    return rec


def run_bench(runner, questions: list[Question], methods: list[str], base: EngineConfig, out_dir: str | Path,
              progress: bool = True, fresh: bool = False, on_record: Callable[[dict], None] | None = None,
              should_stop: Callable[[], bool] | None = None, guard: Callable[[], Any] | None = None,
              repeats: int = 1) -> "pandas.DataFrame":
    """Run every (question, method) `repeats` times (repeat by repeat, so slow drifts of the machine
    spread over all methods), vanilla first per question; each record carries its `repeat` and is
    compared to vanilla's record of the same repeat. Append each record to results.jsonl as it
    completes (and hand it to `on_record`). Rerunning into the same out_dir skips finished records
    (the run's model, head and settings must be the same: run.json; a larger `repeats` adds the
    missing repeats); `fresh` starts over. `should_stop()` is checked before every record: True ends the run early (the
    reports then cover what finished). Each record runs inside `guard()` (a context manager, e.g.
    a lock that keeps other users off a shared model). Writes summary.csv, summary.md, speedup.html and
    acceptance.html at the end (`write_reports`)."""
    import pandas as pd
    from tqdm import tqdm

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be an integer >= 1, got {repeats!r}")
    out_dir = Path(out_dir)
    methods = ["vanilla"] + [m for m in methods if m != "vanilla"]
    identity = _run_identity(runner, base)
    done = _resume_records(out_dir, identity, fresh)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RUN_FILE).write_text(json.dumps(identity, indent=1), encoding="utf-8")
    by_key = {(r["question_id"], r["method"], r.setdefault("repeat", 0)): r for r in done}
    tol = gap_tolerance(str(runner.target.dtype))
    engine = [m for m in methods if m not in PEERS]
    lossy = [m for m in engine if not is_lossless(base.with_overrides({"method": m}))]
    todo = [(q, m, k) for k in range(repeats) for q in questions for m in methods
            if (q.question_id, m, k) not in by_key]
    # Warm-up (Spec-Bench runs the first question before timing): one short run per method.
    if todo:
        for m in methods:
            if m in PEERS:
                hf_generate(runner, runner.encode("Hello!"), m, 8)
            else:
                runner.generate("Hello!", base.with_overrides({"method": m, "max_new_tokens": 8}))
    records: list[dict] = []
    # the kept records, rewritten atomically (drops a line cut by an interruption); new ones append
    _atomic_text(out_dir / RESULTS_FILE, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in done))
    with (out_dir / RESULTS_FILE).open("a", encoding="utf-8") as fh, \
            tqdm(total=repeats * len(questions) * len(methods), initial=repeats * len(questions) * len(methods) - len(todo),
                 desc="bench", unit="run", disable=not progress, file=sys.stderr) as bar:
        sink = RecordSink(fh, bar, on_record)
        for k in range(repeats):
            for q in questions:
                for m in methods:
                    rec = by_key.get((q.question_id, m, k))
                    if rec is None:
                        if should_stop is not None and should_stop():
                            break
                        bar.set_postfix_str(f"q{q.question_id} {q.category} {m}" + (f" #{k + 1}" if repeats > 1 else ""))
                        with (guard or contextlib.nullcontext)():
                            if m in PEERS:
                                rec = run_peer_question(runner, q, m, base.max_new_tokens)
                            else:
                                rec = run_question(runner, q, base.with_overrides({"method": m}),
                                                   score_nll=bool(lossy) and (m == "vanilla" or m in lossy),
                                                   keep_margins=m == "vanilla")
                        rec["repeat"] = k
                        ref = rec if m == "vanilla" else by_key[(q.question_id, "vanilla", k)]
                        rec = compare_to_vanilla(rec, ref, tol)
                        by_key[(q.question_id, m, k)] = rec
                        sink.add(rec)
                    records.append(rec)
    df = pd.DataFrame(records)
    summary = summarize(df)
    write_reports(summary, df, out_dir)
    return summary


@dataclass
class RecordSink:
    """Where a finished record goes: appended to the results JSONL (flushed, so an interruption
    keeps it), one step of the progress bar, and `on_record` (the Lab's live table)."""
    fh: Any
    bar: Any
    on_record: Callable[[dict], None] | None = None

    def add(self, rec: dict) -> None:
        self.fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        self.fh.flush()
        self.bar.update(1)
        if self.on_record is not None:
            self.on_record(rec)


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_reports(summary: "pandas.DataFrame", records: "pandas.DataFrame", out_dir: str | Path) -> None:
    """summary.csv, summary.md (every column), speedup.html (speedup per category and method) and
    acceptance.html (accepted-length histograms per method), each written atomically; the HTML
    embeds plotly.js, so the charts open offline."""
    out_dir = Path(out_dir)
    _atomic_text(out_dir / "summary.csv", summary.to_csv(index=False, float_format="%.4f"))
    _atomic_text(out_dir / "summary.md", "Speedup over vanilla (mean accepted length, bonus included):\n\n"
                 + speedup_matrix_markdown(summary) + "\n\nEvery metric:\n\n" + summary_table_markdown(summary) + "\n")
    figs = bench_figures(summary, records)
    for name, fig in figs.items():
        _atomic_text(out_dir / f"{name}.html", fig.to_html(include_plotlyjs=True, full_html=True))


def bench_figures(summary: "pandas.DataFrame", records: "pandas.DataFrame") -> dict:
    """Plotly figures: grouped bars of speedup per category and method; accepted-length histograms
    (share of steps that accepted k draft tokens, per engine method)."""
    import plotly.graph_objects as go

    speed = go.Figure()
    for method in dict.fromkeys(summary.method):
        part = summary[summary.method == method]
        speed.add_bar(name=method, x=list(part.category), y=list(part.speedup_vs_vanilla),
                      text=[f"{v:.2f}x" for v in part.speedup_vs_vanilla], textposition="outside")
    speed.update_layout(title="Speedup over vanilla (ratio of mean tokens/s)", barmode="group",
                        yaxis_title="speedup", xaxis_title="category", template="plotly_white")
    speed.add_hline(y=1.0, line_dash="dot", line_color="gray")
    if "speedup_min" in summary and (summary.get("repeats", 1) > 1).any():
        for trace, method in zip(speed.data, dict.fromkeys(summary.method)):
            part = summary[summary.method == method]
            trace.error_y = dict(type="data", symmetric=False,
                                 array=list((part.speedup_max - part.speedup_vs_vanilla).fillna(0)),
                                 arrayminus=list((part.speedup_vs_vanilla - part.speedup_min).fillna(0)))
        speed.update_layout(title="Speedup over vanilla (ratio of mean tokens/s; bars span the per-repeat min-max)")
    acc = go.Figure()
    if "accept_hist" in records:
        for method, g in records.groupby("method", sort=False):
            total: list[int] = []
            for h in g.accept_hist:
                _add_hist(total, h or [])
            if not total or method == "vanilla":
                continue
            n = sum(total)
            acc.add_bar(name=method, x=list(range(len(total))), y=[c / n for c in total])
    acc.update_layout(title="Accepted draft tokens per step (share of steps; the bonus token not counted)",
                      barmode="group", xaxis_title="accepted draft tokens", yaxis_title="share of steps",
                      template="plotly_white")
    return {"speedup": speed, "acceptance": acc}


def repeat_speedups(g: "pandas.DataFrame", vanilla: "pandas.DataFrame") -> list[float]:
    """Per repeat present in both: mean tokens/s of `g`'s records over vanilla's of that repeat."""
    van = vanilla.groupby("repeat").tokens_per_s.mean()
    per = g.groupby("repeat").tokens_per_s.mean()
    return [float(per[k] / van[k]) for k in per.index if k in van.index and van[k] > 0]


def summarize(df: "pandas.DataFrame") -> "pandas.DataFrame":
    """Per-category and overall rows per method (Spec-Bench speed.py conventions). `questions`
    counts distinct questions; `repeats` the repeats seen; `speedup_std` (sample std, NaN for one
    repeat), `speedup_min`, `speedup_max` spread the per-repeat speedups (`repeat_speedups`)."""
    import pandas as pd

    df = df.assign(repeat=df["repeat"].fillna(0).astype(int) if "repeat" in df else 0)
    rows = []
    vanilla_speed: dict[str, float] = {}
    groups = [(c, df[df.category == c]) for c in [c for c in CATEGORIES if c in set(df.category)]]
    groups.append(("overall", df))
    for cat, part in groups:
        vanilla = part[part.method == "vanilla"]
        for method, g in part.groupby("method", sort=False):
            speed = float(g.tokens_per_s.mean())
            if method == "vanilla":
                vanilla_speed[cat] = speed
            per = repeat_speedups(g, vanilla)
            spread = {"repeats": int(g.repeat.nunique()),
                      "speedup_std": float(pd.Series(per).std(ddof=1)) if len(per) > 1 else float("nan"),
                      "speedup_min": min(per) if per else float("nan"),
                      "speedup_max": max(per) if per else float("nan")}
            rows.append({"category": cat, "method": method, "questions": int(g.question_id.nunique()),
                         "tokens_per_s": speed,
                         "mean_accepted": float(g.committed.sum() / g.steps.sum()) if g.steps.sum() else 1.0,
                         "exact_match_rate": float(g.matches_vanilla.mean()),
                         "lossless_rate": float(g.lossless.mean()),
                         "rouge_l_vs_vanilla": float(g.rouge_l_vs_vanilla.mean()),
                         "nll_ratio": float(g.nll_ratio.dropna().mean()) if g.nll_ratio.notna().any() else float("nan"),
                         "retrieval_step_share": float(g.retrieval_steps.sum() / g.steps.sum()) if g.steps.sum() else 0.0,
                         "trigger_rate": float(g.trigger_fired.sum() / g.steps.sum()) if g.steps.sum() else 0.0,
                         "relaxed_per_token": float(g.relaxed_tokens.sum() / g.new_tokens.sum()) if g.new_tokens.sum() else 0.0,
                         "trie_branching": _branching(g),
                         **spread})
    out = pd.DataFrame(rows)
    out.insert(4, "speedup_vs_vanilla", [r["tokens_per_s"] / vanilla_speed[r["category"]]
                                         if vanilla_speed.get(r["category"]) else float("nan") for r in rows])
    return out


def _branching(g) -> float:
    """Among retrieval steps that chose >= 2 candidates, the share with >= 2 of them in the verified
    trie (NaN when no step chose two; records written before the column existed count as none)."""
    if "multi_chosen_steps" not in g:
        return float("nan")
    n = g.multi_chosen_steps.fillna(0).sum()
    return float(g.branching_steps.fillna(0).sum() / n) if n else float("nan")


SUMMARY_COLUMNS = {"questions": "{:.0f}", "tokens_per_s": "{:.1f}", "speedup_vs_vanilla": "{:.2f}x",
                   "mean_accepted": "{:.2f}", "exact_match_rate": "{:.2f}", "lossless_rate": "{:.2f}",
                   "rouge_l_vs_vanilla": "{:.2f}", "nll_ratio": "{:.3f}", "retrieval_step_share": "{:.2f}",
                   "trigger_rate": "{:.2f}", "relaxed_per_token": "{:.3f}", "trie_branching": "{:.2f}"}


def _repeated(summary: "pandas.DataFrame") -> bool:
    return "repeats" in summary and bool((summary.repeats > 1).any())


def spread_text(row) -> str:
    """"±std [min–max]" of a summary row's per-repeat speedups ("" for one repeat)."""
    if row.get("repeats", 1) <= 1 or row.get("speedup_min") != row.get("speedup_min"):
        return ""
    std = row["speedup_std"]
    return (f"±{std:.2f} " if std == std else "") + f"[{row['speedup_min']:.2f}–{row['speedup_max']:.2f}]"


def speedup_matrix_markdown(summary: "pandas.DataFrame") -> str:
    """Categories x methods: speedup over vanilla with the mean accepted length in brackets (and,
    with several repeats, the per-repeat spread: ±std [min–max])."""
    repeated = _repeated(summary)
    methods = list(dict.fromkeys(summary.method))
    lines = ["| category | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for cat in dict.fromkeys(summary.category):
        cells = []
        for m in methods:
            r = summary[(summary.category == cat) & (summary.method == m)]
            spread = "" if r.empty or not repeated else " " + spread_text(r.iloc[0])
            cells.append("" if r.empty else f"{r.iloc[0].speedup_vs_vanilla:.2f}x{spread.rstrip()} "
                                            f"({r.iloc[0].mean_accepted:.2f})")
        lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_table_markdown(summary: "pandas.DataFrame") -> str:
    """Every summary column, one row per (category, method); with several repeats, also `repeats`
    and `speedup_spread` (±std [min–max] of the per-repeat speedups)."""
    cols = list(SUMMARY_COLUMNS)
    repeated = _repeated(summary)
    extra = ["repeats", "speedup_spread"] if repeated else []
    lines = ["| category | method | " + " | ".join(cols + extra) + " |", "|---|---|" + "---|" * len(cols + extra)]
    for _, r in summary.iterrows():
        cells = [r.category, r.method] + ["" if r[c] != r[c] else SUMMARY_COLUMNS[c].format(r[c]) for c in cols]
        if repeated:
            cells += [f"{r.repeats:.0f}", spread_text(r)]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)
