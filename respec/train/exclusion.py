"""Keeping benchmark questions out of head training data.

Contract:
- `text_fingerprints(text)` / `BenchmarkGuard.from_texts(texts)`: for every text (every turn of
  every question), the hashes of its first, middle and last window of `NGRAM` normalised words (the
  whole text when it is shorter). A prompt that contains a benchmark question verbatim (up to case,
  punctuation and spacing) contains all three windows, so it matches; a prompt sharing any one window
  with a question matches as well (the check errs on the side of refusing).
- `BenchmarkGuard.load(extra_files)`: the committed fingerprints of the Spec-Bench dev split
  (`spec_bench_fingerprints.txt` next to this module, written by `python -m respec.train.exclusion
  --write QUESTIONS.jsonl`), plus those of every questions file the caller names. `guard.matches(text)`
  says whether a prompt overlaps a benchmark question; `guard.check_prompts` raises RespecError naming
  the first offenders.
No file is read at import.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from respec._io import atomic_write_text
from respec.errors import RespecError

NGRAM = 12
FINGERPRINT_FILE = Path(__file__).with_name("spec_bench_fingerprints.txt")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def words(text: str) -> list[str]:
    """Lower-cased alphanumeric words: the normal form both sides of the check are compared in."""
    return _WORD.findall(text.lower())


def _hash(ws: Sequence[str]) -> str:
    return hashlib.sha256(" ".join(ws).encode("utf-8")).hexdigest()[:20]


def text_fingerprints(text: str, n: int = NGRAM) -> list[tuple[int, str]]:
    """(window length, hash) of the first, middle and last n-word window of `text`."""
    ws = words(text)
    if not ws:
        return []
    k = min(n, len(ws))
    starts = sorted({0, (len(ws) - k) // 2, len(ws) - k})
    return [(k, _hash(ws[s:s + k])) for s in starts]


def question_texts(path: str | Path) -> list[str]:
    """Every turn of every question in a Spec-Bench style JSONL file ("turns"; or "prompt"/"text")."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RespecError(f"cannot read questions file {path}: {exc}") from None
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            turns = row["turns"] if "turns" in row else [row.get("prompt", row.get("text"))]
        except (json.JSONDecodeError, AttributeError) as exc:
            raise RespecError(f"{path}:{n}: not a JSON object ({exc})") from None
        out += [str(t) for t in turns if t]
    return out


@dataclass(frozen=True)
class BenchmarkGuard:
    """Fingerprints by window length; `matches` hashes a prompt's windows of those lengths only."""
    by_length: dict[int, frozenset[str]]

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> "BenchmarkGuard":
        acc: dict[int, set[str]] = {}
        for t in texts:
            for k, h in text_fingerprints(t):
                acc.setdefault(k, set()).add(h)
        return cls({k: frozenset(v) for k, v in acc.items()})

    @classmethod
    def load(cls, extra_files: Sequence[str | Path] = (), fingerprint_file: Path | None = None) -> "BenchmarkGuard":
        acc: dict[int, set[str]] = {}
        f = fingerprint_file or FINGERPRINT_FILE
        if not f.is_file():
            raise RespecError(f"benchmark fingerprint file missing: {f}")
        for line in f.read_text(encoding="utf-8").split():
            k, h = line.split(":")
            acc.setdefault(int(k), set()).add(h)
        for path in extra_files:
            for k, v in cls.from_texts(question_texts(path)).by_length.items():
                acc.setdefault(k, set()).update(v)
        return cls({k: frozenset(v) for k, v in acc.items()})

    def lines(self) -> list[str]:
        """Every fingerprint as "LENGTH:HASH", sorted: the fingerprint file's format."""
        return sorted(f"{k}:{h}" for k, v in self.by_length.items() for h in v)

    def digest(self) -> str:
        """sha256 of every fingerprint: equal digests, equal guards (verdicts cached under it stay valid)."""
        return hashlib.sha256("\n".join(self.lines()).encode("utf-8")).hexdigest()

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_length.values())

    def matches(self, text: str) -> bool:
        ws = words(text)
        for k, hashes in self.by_length.items():
            for s in range(0, len(ws) - k + 1):
                if _hash(ws[s:s + k]) in hashes:
                    return True
        return False

    def check_prompts(self, texts: Iterable[tuple[str, str]], what: str = "prompts") -> None:
        """Raise RespecError if any (name, text) overlaps a benchmark question."""
        bad = [name for name, text in texts if self.matches(text)]
        if bad:
            raise RespecError(f"{len(bad)} of the {what} overlap Spec-Bench questions, which never enter head "
                              f"training data (e.g. {', '.join(bad[:3])})")


def write_fingerprints(question_files: Sequence[str | Path], out: Path = FINGERPRINT_FILE) -> int:
    guard = BenchmarkGuard.from_texts(t for f in question_files for t in question_texts(f))
    lines = guard.lines()
    atomic_write_text(out, "\n".join(lines) + "\n")
    return len(lines)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="write the committed benchmark fingerprints")
    ap.add_argument("--write", nargs="+", required=True, metavar="QUESTIONS.jsonl")
    a = ap.parse_args()
    print(f"{write_fingerprints(a.write)} fingerprints written to {FINGERPRINT_FILE}")
