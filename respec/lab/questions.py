"""Spec-Bench questions: the question JSONL read into `Question` records.

Contract: `load_questions(path, categories, limit_per_category)` reads one JSON object per line
({"question_id", "category", "turns"}), maps MT-bench's eight subcategories to the bench category
`mt_bench` (`bench_category`), keeps the categories asked for (a bench category or an MT-bench
subcategory; ConfigError for an unknown one), the `split` asked for ("all"; "even" or "odd":
the questions whose `question_id` has that parity, applied before the limit) and at most
`limit_per_category` per category, in file order. The project's honest split: device defaults and
thresholds are tuned on the dev split's even ids, reported figures come from the odd ones. RespecError for a missing file, a malformed line, or an empty selection. Nothing is read at
import.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from respec.errors import ConfigError, RespecError

MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
SPLITS = ("all", "even", "odd")


def bench_category(category: str) -> str:
    return "mt_bench" if category in MT_BENCH else category



@dataclass(frozen=True)
class Question:
    question_id: int
    category: str          # the bench category (MT-bench subcategories -> "mt_bench")
    turns: tuple[str, ...]


def load_questions(path: str | Path, categories: Sequence[str] | None = None,
                   limit_per_category: int | None = None, split: str = "all") -> list[Question]:
    if split not in SPLITS:
        raise ConfigError(f"unknown question split {split!r}; choose from {', '.join(SPLITS)}")
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
        if split != "all" and q.question_id % 2 != (split == "odd"):
            continue
        if limit_per_category is not None and counts.get(q.category, 0) >= limit_per_category:
            continue
        counts[q.category] = counts.get(q.category, 0) + 1
        out.append(q)
    if not out:
        raise RespecError(f"no questions selected from {path}" + (f" (split {split})" if split != "all" else ""))
    return out

