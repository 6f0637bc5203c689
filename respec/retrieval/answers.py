"""Earlier answers as a retrieval source (ReSpec's cross-request memory, `candidates.memory_tokens`).

Contract: `AnswerMemory` keeps the generated tokens of a runner's earlier requests, newest last, at
most `MAX_TOKENS` in all (the oldest answers are dropped first). `corpus(limit)` is the newest
answers that fit in `limit` tokens, oldest first, each followed by `SEPARATOR` (-1: no token id, so
no match and no copied draft crosses from one answer into the next). `MemoryIndex` is that corpus
as an n-gram position index with `continuation(e, n)` stopping at a separator. Nothing at import.
"""
from __future__ import annotations

from collections import deque
from typing import Sequence

from respec.retrieval.position_index import MatchPosition, NgramPositionIndex

SEPARATOR = -1
MAX_TOKENS = 65_536


class AnswerMemory:
    def __init__(self, max_tokens: int = MAX_TOKENS) -> None:
        self._answers: deque[tuple[int, ...]] = deque()
        self._tokens = 0
        self.max_tokens = max_tokens

    def add(self, tokens: Sequence[int]) -> None:
        answer = tuple(int(t) for t in tokens)
        if not answer:
            return
        self._answers.append(answer)
        self._tokens += len(answer)
        while self._tokens > self.max_tokens and len(self._answers) > 1:
            self._tokens -= len(self._answers.popleft())

    def __len__(self) -> int:
        return len(self._answers)

    def corpus(self, limit: int) -> list[int]:
        """The newest answers within `limit` tokens (separators included), oldest first."""
        picked: list[tuple[int, ...]] = []
        used = 0
        for answer in reversed(self._answers):
            if used + len(answer) + 1 > limit:
                break
            picked.append(answer)
            used += len(answer) + 1
        out: list[int] = []
        for answer in reversed(picked):
            out.extend(answer)
            out.append(SEPARATOR)
        return out


class MemoryIndex:
    """Match positions in a corpus of earlier answers (see the module docstring)."""

    def __init__(self, corpus: Sequence[int]) -> None:
        self.tokens = list(corpus)
        self.index = NgramPositionIndex(qmax=8)
        self.index.extend(self.tokens)

    def positions(self, query: Sequence[int], min_match: int, max_n: int) -> list[MatchPosition]:
        if not self.tokens:
            return []
        return [p for p in self.index.positions(query, min_match=min_match, max_n=max_n, max_examined=max_n)
                if self.tokens[p.end + 1] != SEPARATOR]

    def continuation(self, end: int, n: int) -> list[int]:
        out = []
        for t in self.tokens[end + 1:end + 1 + n]:
            if t == SEPARATOR:
                break
            out.append(t)
        return out
