"""N-gram position index: every earlier end position of the current suffix (ReSpec, §1.4.1 (b)).

Contract
--------
* The index holds a growing **history** ``hist`` of token ids, 0-based. ``extend(tokens)`` /
  ``append(token)`` cost amortised O(qmax) per token: for the new index ``t`` it records ``t`` under
  each of the ``qmax`` (or fewer, near the start) n-grams ``hist[t-q+1 .. t]``, q = 1 .. qmax. The
  n-grams are stored as a trie over the *reversed* history (depth <= qmax), so recording and
  looking up an n-gram costs O(q) integer dict operations.
* ``positions(query, min_match, max_n, ...)``: ``query`` is the current sequence
  ``seq = hist + [root]`` (``root`` = the token just sampled, not yet in the history), or any
  non-empty suffix of it (its last ``cap`` tokens are enough). Candidates are end indices ``e`` in
  the history with ``hist[e] == seq[-1]`` that have a continuation token, i.e.
  ``e <= len(hist) - 2``. The match length of ``e`` is the largest ``m`` with
  ``hist[e-m+1 .. e] == seq[-m:]``, capped at ``cap`` and at ``len(query)``. See
  :meth:`NgramPositionIndex.positions` for the examination limit and the ranking.
* ``continuation(e, n)`` is the draft that candidate ``e`` proposes: ``hist[e+1 : e+1+n]``.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from respec.errors import ConfigError
from respec.retrieval.suffix_automaton import TokenView

__all__ = ["MatchPosition", "NgramPositionIndex"]


@dataclass(frozen=True)
class MatchPosition:
    """An earlier occurrence: ``end`` is the 0-based history index matching ``seq[-1]`` and
    ``match_length`` the (capped) number of tokens matched backwards from it."""

    end: int
    match_length: int


class _Node:
    """Trie node for the n-gram read backwards from its last token. ``ends`` lists, in increasing
    order, every history index t at which that n-gram ends."""

    __slots__ = ("children", "ends")

    def __init__(self) -> None:
        self.children: dict[int, _Node] | None = None  # created on first child (saves memory)
        self.ends: list[int] = []


class NgramPositionIndex:
    """All end positions of every n-gram (n = 1 .. ``qmax``) of a growing token history."""

    def __init__(self, qmax: int = 8) -> None:
        if not isinstance(qmax, int) or isinstance(qmax, bool) or qmax < 1:
            raise ConfigError(f"The n-gram index needs qmax >= 1, got {qmax!r}.")
        self.qmax = qmax
        self._hist: list[int] = []
        self._root = _Node()

    def __len__(self) -> int:
        """Number of history tokens indexed."""
        return len(self._hist)

    @property
    def tokens(self) -> TokenView:
        """The history, 0-based, as a read-only live view."""
        return TokenView(self._hist)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append every token of ``tokens`` to the history, in order."""
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        """Append one token and index the n-grams ending at it (O(qmax))."""
        hist = self._hist
        t = len(hist)
        hist.append(token)
        node = self._root
        for k in range(min(self.qmax, t + 1)):
            tok = hist[t - k]
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(tok)
            if child is None:
                child = children[tok] = _Node()
            child.ends.append(t)
            node = child

    def _lookup(self, key_reversed: Sequence[int]) -> list[int]:
        node: _Node | None = self._root
        for tok in key_reversed:
            children = node.children  # type: ignore[union-attr]
            node = None if children is None else children.get(tok)
            if node is None:
                return []
        return node.ends  # type: ignore[union-attr]

    def positions(self, query: Sequence[int], min_match: int, max_n: int,
                  max_examined: int = 64, cap: int = 32) -> list[MatchPosition]:
        """Earlier end positions of the current sequence's suffix, best first.

        ``query`` is ``seq = hist + [root]`` or a non-empty suffix of it (see the module
        docstring). Procedure:

        1. ``q = min(min_match, qmax, len(query))``; look up every history end index ``e`` of the
           n-gram ``query[-q:]``, most recent first, skipping ``e = len(hist) - 1`` (it has no
           continuation token).
        2. Examine at most ``max_examined`` of them: each one's match length is computed by
           backward comparison with ``query``, capped at ``cap`` (and ``len(query)``).
        3. Keep those with ``match_length >= min_match``; rank by match length (descending),
           then recency (larger ``e`` first); return the first ``max_n``.

        With ``max_examined`` at least the number of candidates, the result is exactly every
        ``e <= len(hist) - 2`` whose capped match length is ``>= min_match``, ranked as above.
        """
        if min_match < 1:
            raise ConfigError(f"The minimum match length must be at least 1, got {min_match}.")
        if cap < 1:
            raise ConfigError(f"The match-length cap must be at least 1, got {cap}.")
        if max_n < 0 or max_examined < 0:
            raise ConfigError(f"max_n and max_examined must be non-negative, got {max_n} and "
                              f"{max_examined}.")
        nq = len(query)
        if nq == 0:
            raise ConfigError("The query must hold at least the root token.")
        if max_n == 0 or max_examined == 0 or min_match > min(cap, nq):
            return []
        hist = self._hist
        q = min(min_match, self.qmax, nq)
        ends = self._lookup([query[nq - 1 - k] for k in range(q)])
        limit = min(cap, nq)
        last_ok = len(hist) - 2
        found: list[MatchPosition] = []
        examined = 0
        for i in range(len(ends) - 1, -1, -1):
            e = ends[i]
            if e > last_ok:
                continue
            if examined >= max_examined:
                break
            examined += 1
            m = q  # the first q tokens are known to match
            top = min(limit, e + 1)
            while m < top and hist[e - m] == query[nq - 1 - m]:
                m += 1
            if m >= min_match:
                found.append(MatchPosition(e, m))
        found.sort(key=lambda mp: (-mp.match_length, -mp.end))
        return found[:max_n]

    def continuation(self, end: int, n: int) -> list[int]:
        """The ``n`` history tokens after ``end`` (fewer near the end of the history)."""
        if n < 0:
            raise ConfigError(f"The continuation length must be non-negative, got {n}.")
        if end < -1 or end >= len(self._hist):
            raise ConfigError(f"End index {end} is outside the history of {len(self._hist)} "
                              "tokens.")
        return self._hist[end + 1 : end + 1 + n]
