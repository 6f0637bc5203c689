"""Online suffix automaton (Blumer et al.) over integer token ids, with a matching cursor.

Contract
--------
* The automaton indexes one growing text of token ids. ``append(token)`` / ``extend(tokens)``
  add tokens at the end in amortised O(1) time per token (dict operations counted as O(1)).
  Text positions are **0-based**: ``tokens[i]`` is the i-th token appended. (SAM-Decoding's
  reference uses a ``-1`` sentinel and 1-based positions; this module does not.)
* Every state ``s`` has ``next`` (dict token -> state), ``link`` (suffix link, ``-1`` for the
  root, state ``0``), ``length`` (length of the longest string of the state) and ``first_end``
  (0-based index of the END of the FIRST occurrence of the state's strings; ``-1`` for the root).
  A clone copies ``first_end`` from the state it splits, so ``first_end`` always marks the first
  occurrence.
* The **cursor** tracks, after every append, the longest suffix of the text that also occurred
  earlier, i.e. an occurrence that ends strictly before the last position (matching statistics).
  It is advanced with the new token *before* the token is inserted, exactly as in SAM-Decoding;
  ``match_length`` is its length (0 for an empty or one-token text).
* ``peek(token)`` is non-mutating: it returns the longest suffix of ``text + [token]`` that
  occurs in ``text``, as a :class:`Match` (its length, its state and the end index of its first
  occurrence, ``-1`` when the length is 0). This is SAM-Decoding's ``lookup`` with the root token.
* ``earliest_continuation(token, n)`` is SAM-Decoding's dynamic ``gen_draft`` (including its
  ``to_anc`` climb); see its docstring for the exact selection rule. Unlike the reference, the
  returned tokens do NOT include ``token`` itself: they are the tokens that follow it.

Only the earliest occurrence of a match is available from the automaton; every occurrence is
enumerated by :class:`respec.retrieval.position_index.NgramPositionIndex`.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from respec.errors import ConfigError

__all__ = ["ROOT", "Continuation", "Match", "State", "SuffixAutomaton", "TokenView"]

ROOT = 0
"""Index of the root state (the empty string)."""


@dataclass(frozen=True)
class Match:
    """A suffix of ``text + [token]`` that occurs in ``text``.

    ``length``: number of tokens matched (the token itself included), 0 when nothing matched.
    ``state``: automaton state holding the matched string (``ROOT`` when ``length == 0``).
    ``first_end``: 0-based index in the text of the end of the first occurrence, ``-1`` when
    ``length == 0``; the matched string is ``text[first_end - length + 1 : first_end + 1]``.
    """

    length: int
    state: int
    first_end: int


@dataclass(frozen=True)
class Continuation:
    """Tokens copied after the first occurrence of a match.

    ``tokens``: ``text[end + 1 : end + 1 + n]`` (possibly fewer than n near the end of the text).
    ``match_length``: length of the match whose first occurrence was used (0 when none).
    ``end``: 0-based end index of that first occurrence, ``-1`` when ``match_length == 0``.
    """

    tokens: list[int]
    match_length: int
    end: int


class State:
    """One automaton state. Fields are public for inspection; do not modify them."""

    __slots__ = ("next", "link", "length", "first_end")

    def __init__(self, length: int, link: int, first_end: int, nxt: dict[int, int] | None = None):
        self.next: dict[int, int] = {} if nxt is None else nxt
        self.link = link
        self.length = length
        self.first_end = first_end

    def __repr__(self) -> str:
        return (f"State(length={self.length}, link={self.link}, first_end={self.first_end}, "
                f"next={self.next!r})")


class TokenView(Sequence[int]):
    """Read-only, live view of a token list. Indexing gives an int, slicing gives a new list,
    and it compares equal to any list or tuple with the same tokens."""

    __slots__ = ("_data",)

    def __init__(self, data: list[int]):
        self._data = data

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        return self._data[index]

    def __len__(self) -> int:
        return len(self._data)

    def __iter__(self) -> Iterator[int]:
        return iter(self._data)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenView):
            return self._data == other._data
        if isinstance(other, (list, tuple)):
            return len(other) == len(self._data) and all(a == b for a, b in zip(self._data, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # live and mutable underneath

    def __repr__(self) -> str:
        return f"TokenView({self._data!r})"


class SuffixAutomaton:
    """Online suffix automaton over token ids with a SAM-Decoding matching cursor.

    See the module docstring for the full contract. Typical use, once per decoding step::

        m = sam.peek(root)                        # longest earlier match of history + [root]
        draft = sam.earliest_continuation(root, 40)
        sam.extend(accepted_tokens)               # after verification
    """

    def __init__(self) -> None:
        self._states: list[State] = [State(length=0, link=-1, first_end=-1)]
        self._text: list[int] = []
        self._last = ROOT  # state of the whole text
        self._cur_state = ROOT  # matching cursor: state ...
        self._cur_len = 0  # ... and length of the longest suffix that occurred earlier

    # ------------------------------------------------------------------ inspection
    def __len__(self) -> int:
        """Number of tokens indexed."""
        return len(self._text)

    @property
    def tokens(self) -> TokenView:
        """The indexed text, 0-based, as a read-only live view."""
        return TokenView(self._text)

    @property
    def states(self) -> Sequence[State]:
        """All states; index 0 is the root. Read-only by convention."""
        return self._states

    @property
    def num_states(self) -> int:
        return len(self._states)

    @property
    def last(self) -> int:
        """State of the whole text."""
        return self._last

    @property
    def match_length(self) -> int:
        """Length of the longest suffix of the text that also occurred ending strictly before the
        last position (0 for an empty or one-token text)."""
        return self._cur_len

    @property
    def match_state(self) -> int:
        """State of the cursor (``ROOT`` when ``match_length == 0``)."""
        return self._cur_state

    @property
    def cursor(self) -> Match:
        """The cursor as a :class:`Match` (``first_end`` marks its first occurrence)."""
        if self._cur_len == 0:
            return Match(0, ROOT, -1)
        return Match(self._cur_len, self._cur_state, self._states[self._cur_state].first_end)

    # ------------------------------------------------------------------ matching
    def _step(self, state: int, length: int, token: int) -> tuple[int, int]:
        """Transition the match (state, length) by ``token``, falling back along suffix links."""
        states = self._states
        while state != ROOT and token not in states[state].next:
            state = states[state].link
            length = states[state].length
        target = states[state].next.get(token)
        if target is None:
            return ROOT, 0
        return target, length + 1

    def peek(self, token: int) -> Match:
        """Longest suffix of ``text + [token]`` that occurs in ``text``; does not change anything."""
        state, length = self._step(self._cur_state, self._cur_len, token)
        if length == 0:
            return Match(0, ROOT, -1)
        return Match(length, state, self._states[state].first_end)

    def earliest_continuation(self, token: int, n: int) -> Continuation:
        """Up to ``n`` tokens that follow the first occurrence of a match of ``text + [token]``.

        Rule: let ``m = peek(token)``. If ``m.length == 0`` the result is empty
        (``Continuation([], 0, -1)``). Otherwise the candidates are ``m.state`` (match length
        ``m.length``) and its suffix-link ancestors with length >= 1 (match length = their
        ``length``: shorter suffixes, whose first occurrence may be earlier). For a candidate with
        first occurrence ending at ``e``, ``len(text) - e - 1`` tokens are available after it.
        The chosen candidate is the longest match with at least ``n`` tokens available; if no
        candidate has ``n`` available, the one with the most available tokens (ties: the longest
        match). The result holds ``text[e + 1 : e + 1 + n]``, that match length, and ``e``.
        ``token`` itself is not part of ``tokens``. ``n == 0`` gives no tokens with the longest
        match; ``n < 0`` is an error.
        """
        if n < 0:
            raise ConfigError(f"The continuation length must be non-negative, got {n}.")
        m = self.peek(token)
        if m.length == 0:
            return Continuation([], 0, -1)
        states = self._states
        total = len(self._text)
        best_state, best_len, best_avail = -1, 0, -1
        state, length = m.state, m.length
        while length >= 1:
            e = states[state].first_end
            avail = total - e - 1
            if avail >= n:
                best_state, best_len = state, length
                break
            if avail > best_avail:  # strict: on ties keep the longer (earlier-visited) match
                best_state, best_len, best_avail = state, length, avail
            state = states[state].link
            length = states[state].length
        e = states[best_state].first_end
        return Continuation(self._text[e + 1 : e + 1 + n], best_len, e)

    # ------------------------------------------------------------------ construction
    def extend(self, tokens: Iterable[int]) -> None:
        """Append every token of ``tokens`` in order."""
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        """Append one token: advance the cursor with it, then insert it (textbook extend)."""
        # 1. Matching statistics: advance the cursor BEFORE inserting the token.
        cur_state, cur_len = self._step(self._cur_state, self._cur_len, token)

        # 2. Textbook online extend.
        states = self._states
        pos = len(self._text)  # 0-based index of the new token
        self._text.append(token)
        new = len(states)
        states.append(State(length=states[self._last].length + 1, link=ROOT, first_end=pos))
        p = self._last
        while p != -1 and token not in states[p].next:
            states[p].next[token] = new
            p = states[p].link
        if p != -1:
            q = states[p].next[token]
            if states[p].length + 1 == states[q].length:
                states[new].link = q
            else:
                clone = len(states)
                sq = states[q]
                states.append(State(length=states[p].length + 1, link=sq.link,
                                    first_end=sq.first_end, nxt=dict(sq.next)))
                while p != -1 and states[p].next.get(token) == q:
                    states[p].next[token] = clone
                    p = states[p].link
                sq.link = clone
                states[new].link = clone
                # The cursor's string may have moved from q into the clone (it does whenever the
                # cursor sits in q with a length the clone now covers).
                if cur_state == q and cur_len <= states[clone].length:
                    cur_state = clone
        self._last = new
        self._cur_state, self._cur_len = cur_state, cur_len
