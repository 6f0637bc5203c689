"""Spec-Bench runner: question JSONL in, per-question records and a per-category summary out.

Contract (ALGORITHMS.md §6): greedy, batch 1, chat template of the target, multi-turn questions
run turn by turn (turn 2 follows the method's own turn-1 answer). MT-bench's eight subcategories are
grouped as `mt_bench`. Per question and method one record goes to `DIR/results.jsonl` (appended and
flushed as it completes, so an interrupted run keeps every finished record); `DIR/summary.csv` is
written at the end through a temporary file and an atomic rename.

Metrics: per-question speed = new tokens / wall seconds; `tokens_per_s` is the mean of those;
`speedup_vs_vanilla` is a ratio of means (Spec-Bench's speed.py); `mean_accepted` = committed
tokens per target forward over all steps of all questions (includes the bonus token);
`exact_match_rate` = share of questions whose tokens equal vanilla's; `lossless_rate` = share that
equal vanilla or first diverge where vanilla's top-1/top-2 logit gap is within the rounding
tolerance of the model's dtype (0.5 in bf16/fp16, 1e-3 in fp32/fp64): see README "Lossless".
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

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


def run_question(runner, q: Question, config: EngineConfig, score_nll: bool = False) -> dict[str, Any]:
    """All turns of one question with one method; returns a record (token lists kept for comparison).
    With `score_nll`, the output's negative log-likelihood under the target is measured per turn."""
    messages: list[dict] = []
    nll_sum, nll_n = 0.0, 0
    relaxed = retrieval_steps = fired = 0
    tokens: list[int] = []
    margins: list[float] = []
    texts: list[str] = []
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
        if score_nll:
            total, n = runner.target.nll(result.prompt_tokens, result.tokens)
            nll_sum, nll_n = nll_sum + total, nll_n + n
        committed += sum(len(s.new_tokens) for s in result.steps)
        wall += result.wall_time_s
    return {"question_id": q.question_id, "category": q.category, "method": config.method,
            "new_tokens": new_tokens, "wall_s": wall, "tokens_per_s": new_tokens / wall if wall > 0 else 0.0,
            "steps": steps, "mean_accepted": committed / steps if steps else 1.0,
            "committed": committed, "relaxed_tokens": relaxed, "retrieval_steps": retrieval_steps,
            "trigger_fired": fired, "nll_per_token": nll_sum / nll_n if nll_n else None,
            "text": "\n\n".join(texts), "_tokens": tokens, "_margins": margins}


def run_bench(runner, questions: list[Question], methods: list[str], base: EngineConfig, out_dir: str | Path,
              progress: bool = True) -> "pandas.DataFrame":
    import pandas as pd
    from tqdm import tqdm

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    methods = ["vanilla"] + [m for m in methods if m != "vanilla"]
    tol = gap_tolerance(str(runner.target.dtype))
    lossy = [m for m in methods if not is_lossless(base.with_overrides({"method": m}))]
    # Warm-up (Spec-Bench runs the first question before timing): one short run per method.
    for m in methods:
        runner.generate("Hello!", base.with_overrides({"method": m, "max_new_tokens": 8}))
    results_path = out_dir / "results.jsonl"
    records: list[dict] = []
    with results_path.open("w", encoding="utf-8") as fh, \
            tqdm(total=len(questions) * len(methods), desc="bench", unit="run", disable=not progress,
                 file=sys.stderr) as bar:
        for q in questions:
            ref = None
            for m in methods:
                bar.set_postfix_str(f"q{q.question_id} {q.category} {m}")
                rec = run_question(runner, q, base.with_overrides({"method": m}),
                                   score_nll=bool(lossy) and (m == "vanilla" or m in lossy))
                if m == "vanilla":
                    ref = rec
                div = first_divergence(ref["_tokens"], rec["_tokens"])
                rec["matches_vanilla"] = div is None
                rec["first_divergence"] = div
                rec["divergence_gap"] = (None if div is None or div >= len(ref["_margins"])
                                         else ref["_margins"][div])
                rec["lossless"] = div is None or (rec["divergence_gap"] is not None and rec["divergence_gap"] <= tol)
                rec["rouge_l_vs_vanilla"] = rouge_l(ref["_tokens"], rec["_tokens"])
                rec["nll_ratio"] = (rec["nll_per_token"] / ref["nll_per_token"]
                                    if rec["nll_per_token"] is not None and ref["nll_per_token"] else None)
                public = {k: v for k, v in rec.items() if not k.startswith("_")}
                fh.write(json.dumps(public, ensure_ascii=False) + "\n")
                fh.flush()
                records.append(public)
                bar.update(1)
    summary = summarize(pd.DataFrame(records))
    tmp = out_dir / ".summary.csv.tmp"
    summary.to_csv(tmp, index=False, float_format="%.4f")
    os.replace(tmp, out_dir / "summary.csv")
    return summary


def summarize(df: "pandas.DataFrame") -> "pandas.DataFrame":
    """Per-category and overall rows per method (Spec-Bench speed.py conventions)."""
    import pandas as pd

    rows = []
    vanilla_speed: dict[str, float] = {}
    groups = [(c, df[df.category == c]) for c in [c for c in CATEGORIES if c in set(df.category)]]
    groups.append(("overall", df))
    for cat, part in groups:
        for method, g in part.groupby("method", sort=False):
            speed = float(g.tokens_per_s.mean())
            if method == "vanilla":
                vanilla_speed[cat] = speed
            rows.append({"category": cat, "method": method, "questions": len(g), "tokens_per_s": speed,
                         "mean_accepted": float(g.committed.sum() / g.steps.sum()) if g.steps.sum() else 1.0,
                         "exact_match_rate": float(g.matches_vanilla.mean()),
                         "lossless_rate": float(g.lossless.mean()),
                         "rouge_l_vs_vanilla": float(g.rouge_l_vs_vanilla.mean()),
                         "nll_ratio": float(g.nll_ratio.dropna().mean()) if g.nll_ratio.notna().any() else float("nan"),
                         "retrieval_step_share": float(g.retrieval_steps.sum() / g.steps.sum()) if g.steps.sum() else 0.0,
                         "trigger_rate": float(g.trigger_fired.sum() / g.steps.sum()) if g.steps.sum() else 0.0,
                         "relaxed_per_token": float(g.relaxed_tokens.sum() / g.new_tokens.sum()) if g.new_tokens.sum() else 0.0})
    out = pd.DataFrame(rows)
    out.insert(4, "speedup_vs_vanilla", [r["tokens_per_s"] / vanilla_speed[r["category"]]
                                         if vanilla_speed.get(r["category"]) else float("nan") for r in rows])
    return out


def summary_markdown(summary: "pandas.DataFrame") -> str:
    """Table with one row per category and a column group per method (tok/s, speedup, MAT)."""
    lines = []
    methods = list(dict.fromkeys(summary.method))
    head = "| category | " + " | ".join(f"{m} tok/s | {m} speedup | {m} MAT | {m} lossless" for m in methods) + " |"
    lines.append(head)
    lines.append("|" + "---|" * (1 + 4 * len(methods)))
    for cat in dict.fromkeys(summary.category):
        cells = [cat]
        for m in methods:
            r = summary[(summary.category == cat) & (summary.method == m)]
            if r.empty:
                cells += ["", "", "", ""]
                continue
            r = r.iloc[0]
            cells += [f"{r.tokens_per_s:.1f}", f"{r.speedup_vs_vanilla:.2f}x", f"{r.mean_accepted:.2f}",
                      f"{r.lossless_rate:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
