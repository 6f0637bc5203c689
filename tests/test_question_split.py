"""The honest split: `--split even|odd` selects Spec-Bench questions by question_id parity before the
per-category limit (tune on even, report on odd); a bad split is one clear error."""
import json
import subprocess
import sys

import pytest

from respec.lab.questions import load_questions
from respec.errors import ConfigError, RespecError


@pytest.fixture
def questions(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [{"question_id": i, "category": "qa" if i < 6 else "rag", "turns": [f"question {i}"]} for i in range(1, 11)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_split_selects_by_parity_before_the_limit(questions):
    assert [q.question_id for q in load_questions(questions)] == list(range(1, 11))
    assert [q.question_id for q in load_questions(questions, split="odd")] == [1, 3, 5, 7, 9]
    assert [q.question_id for q in load_questions(questions, split="even")] == [2, 4, 6, 8, 10]
    assert [q.question_id for q in load_questions(questions, limit_per_category=2, split="odd")] == [1, 3, 7, 9]
    with pytest.raises(ConfigError, match="split"):
        load_questions(questions, split="third")
    with pytest.raises(RespecError, match="split odd"):
        load_questions(questions, categories=["translation"], split="odd")


def test_cli_refuses_an_unknown_split(questions, tmp_path):
    r = subprocess.run([sys.executable, "-m", "respec", "bench", "--questions", str(questions), "--split", "third",
                        "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 2 and "invalid choice: 'third'" in r.stderr
