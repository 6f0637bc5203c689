"""Suffix automaton: property tests against brute force, plus unit cases."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import token_texts

from respec.errors import ConfigError
from respec.retrieval import ROOT, Continuation, Match, SuffixAutomaton


# ----------------------------------------------------------------------------- brute force
def brute_match_at(text: list[int], seq: list[int], e: int) -> int:
    """Largest m with text[e-m+1 .. e] == seq[-m:] (0 if text[e] != seq[-1])."""
    m = 0
    while m <= e and m < len(seq) and text[e - m] == seq[len(seq) - 1 - m]:
        m += 1
    return m


def brute_longest(text: list[int], seq: list[int], last_end: int) -> tuple[int, int]:
    """Longest suffix of seq occurring in text ending at an index <= last_end, and the end of its
    first occurrence: (length, first_end), or (0, -1) when nothing matches."""
    best, first = 0, -1
    for e in range(last_end + 1):
        m = brute_match_at(text, seq, e)
        if m > best:
            best, first = m, e
    return best, first


def brute_first_end(text: list[int], pattern: list[int]) -> int:
    """End index of the first occurrence of pattern in text, -1 if absent."""
    k = len(pattern)
    for e in range(k - 1, len(text)):
        if text[e - k + 1 : e + 1] == pattern:
            return e
    return -1


def brute_continuation(text: list[int], token: int, n: int) -> Continuation:
    """The documented rule, evaluated over every matched suffix length (not only states)."""
    seq = text + [token]
    longest, _ = brute_longest(text, seq, len(text) - 1)
    if longest == 0:
        return Continuation([], 0, -1)
    options = []  # (length, first_end, available)
    for length in range(longest, 0, -1):
        e = brute_first_end(text, seq[-length:])
        assert e >= 0
        options.append((length, e, len(text) - e - 1))
    full = [o for o in options if o[2] >= n]
    if full:
        length, e, _ = max(full, key=lambda o: o[0])
    else:
        length, e, _ = max(options, key=lambda o: (o[2], o[0]))
    return Continuation(text[e + 1 : e + 1 + n], length, e)


token_lists = token_texts


# ----------------------------------------------------------------------------- properties
@settings(max_examples=60, deadline=None)
@given(token_lists())
def test_cursor_tracks_longest_earlier_suffix_after_every_append(data):
    _, text = data
    sam = SuffixAutomaton()
    for i, tok in enumerate(text):
        sam.append(tok)
        prefix = text[: i + 1]
        want_len, want_first = brute_longest(prefix, prefix, i - 1)
        assert sam.match_length == want_len, (
            f"After {i + 1} tokens the cursor should hold the longest suffix that occurred "
            f"earlier ({want_len} tokens), but it holds {sam.match_length}.")
        cur = sam.cursor
        assert cur.first_end == want_first, (
            f"After {i + 1} tokens the cursor's first occurrence should end at {want_first}, "
            f"not {cur.first_end}.")
        if want_len:
            assert sam.states[cur.state].length >= want_len > sam.states[
                sam.states[cur.state].link].length, (
                "The cursor's state should contain a string of the cursor's length.")
    assert len(sam) == len(text), "The automaton should index every appended token."
    assert sam.tokens == text, "The token view should equal the appended text."
    if len(text) >= 2:
        assert sam.num_states <= 2 * len(text) - 1, (
            f"A suffix automaton of {len(text)} tokens should have at most {2 * len(text) - 1} "
            f"states, not {sam.num_states}.")


@settings(max_examples=60, deadline=None)
@given(token_lists(), st.data())
def test_peek_gives_longest_match_and_its_first_occurrence(data, draw):
    alpha, text = data
    sam = SuffixAutomaton()
    # Check a few intermediate prefixes too, so clones made late are exercised while peeking.
    cuts = sorted(set(draw.draw(st.lists(st.integers(0, len(text)), max_size=4)) + [len(text)]))
    done = 0
    for cut in cuts:
        sam.extend(text[done:cut])
        done = cut
        prefix = text[:cut]
        before = (sam.match_length, sam.match_state, sam.num_states, len(sam))
        for tok in alpha + [max(alpha) + 1]:
            m = sam.peek(tok)
            want_len, want_first = brute_longest(prefix, prefix + [tok], cut - 1)
            assert m.length == want_len, (
                f"Peeking {tok} after {cut} tokens should match {want_len} tokens, "
                f"not {m.length}.")
            assert m.first_end == want_first, (
                f"Peeking {tok} after {cut} tokens: the first occurrence should end at "
                f"{want_first}, not {m.first_end}.")
            if m.length:
                assert prefix[m.first_end - m.length + 1 : m.first_end + 1] == (
                    prefix + [tok])[-m.length:], "The reported occurrence should spell the match."
            else:
                assert m == Match(0, ROOT, -1), "An empty match should be Match(0, ROOT, -1)."
        after = (sam.match_length, sam.match_state, sam.num_states, len(sam))
        assert before == after, "Peeking should not change the automaton or its cursor."


@settings(max_examples=60, deadline=None)
@given(token_lists(max_len=120), st.integers(min_value=0, max_value=12), st.data())
def test_earliest_continuation_follows_the_documented_rule(data, n, draw):
    alpha, text = data
    sam = SuffixAutomaton()
    sam.extend(text)
    for tok in alpha:
        for want_n in (n, len(text) + 1):  # the second never fits: exercises the fallback rule
            got = sam.earliest_continuation(tok, want_n)
            want = brute_continuation(text, tok, want_n)
            assert got == want, (
                f"The continuation after {tok} with n={want_n} should be {want}, but it is "
                f"{got}.")
            assert len(got.tokens) <= want_n, "A continuation should never exceed n tokens."


@settings(max_examples=40, deadline=None)
@given(token_lists(max_len=150))
def test_state_first_end_is_the_first_occurrence_of_every_state(data):
    _, text = data
    sam = SuffixAutomaton()
    sam.extend(text)
    states = sam.states
    for s, state in enumerate(states):
        if s == ROOT:
            assert state.first_end == -1 and state.link == -1, "The root has no occurrence."
            continue
        # Recover the state's longest string by its first occurrence and check it.
        e, k = state.first_end, state.length
        pattern = text[e - k + 1 : e + 1]
        assert len(pattern) == k, "A state's first occurrence should fit inside the text."
        assert brute_first_end(text, pattern) == e, (
            f"State {s}'s first_end should be the end of the first occurrence of its longest "
            f"string ({brute_first_end(text, pattern)}), not {e}.")


# ----------------------------------------------------------------------------- unit cases
def test_empty_automaton_matches_nothing():
    sam = SuffixAutomaton()
    assert len(sam) == 0 and sam.tokens == [], "A new automaton should index no tokens."
    assert sam.match_length == 0, "A new automaton's cursor should be empty."
    assert sam.peek(7) == Match(0, ROOT, -1), "Nothing can match in an empty text."
    assert sam.earliest_continuation(7, 5) == Continuation([], 0, -1), (
        "An empty text should give an empty continuation.")
    assert sam.cursor == Match(0, ROOT, -1), "The empty cursor should be Match(0, ROOT, -1)."


def test_token_never_seen_gives_no_match():
    sam = SuffixAutomaton()
    sam.extend([1, 2, 3, 1, 2])
    assert sam.peek(9).length == 0, "A token absent from the text should not match."
    assert sam.earliest_continuation(9, 4) == Continuation([], 0, -1), (
        "A token absent from the text should give an empty continuation.")


def test_continuation_is_cut_at_the_end_of_the_text():
    sam = SuffixAutomaton()
    sam.extend([5, 6, 7, 8])
    got = sam.earliest_continuation(6, 10)
    assert got == Continuation([7, 8], 1, 1), (
        f"Only the two tokens after the match exist, so the continuation should be [7, 8], "
        f"got {got}.")
    assert sam.earliest_continuation(8, 3) == Continuation([], 1, 3), (
        "A match at the very end should have nothing to continue with.")


def test_continuation_climbs_to_a_shorter_earlier_match_when_needed():
    # "1 2 3" first occurs late (ending at 8); "2 3" occurs much earlier (ending at 1).
    sam = SuffixAutomaton()
    sam.extend([2, 3, 9, 9, 9, 9, 1, 2, 3, 4, 1, 2])
    got = sam.earliest_continuation(3, 3)
    assert got == Continuation([4, 1, 2], 3, 8), (
        f"The longest match has exactly 3 tokens to follow, so it should be used: {got}.")
    got = sam.earliest_continuation(3, 4)
    assert got == Continuation([9, 9, 9, 9], 2, 1), (
        f"Needing 4 tokens, the rule should fall back to the earlier match '2 3': {got}.")


def test_continuation_ties_in_available_tokens_keep_the_longer_match():
    # "1 2 3" and "2 3" both first end at index 2, so both have 5 tokens after them.
    sam = SuffixAutomaton()
    sam.extend([1, 2, 3, 9, 2, 3, 1, 2])
    got = sam.earliest_continuation(3, 6)
    assert got == Continuation([9, 2, 3, 1, 2], 3, 2), (
        f"When no match has 6 tokens available and two tie on 5, the longer match should be "
        f"reported: {got}.")


def test_cursor_moves_into_a_clone():
    # "a b" then "x b": the b-state is split; the cursor after the second b must be the clone.
    sam = SuffixAutomaton()
    sam.extend([1, 2, 3, 2])
    assert sam.match_length == 1, "After 'a b x b' the longest earlier suffix is 'b'."
    assert sam.cursor.first_end == 1, "The first 'b' ends at index 1."
    sam.append(3)
    assert sam.match_length == 2 and sam.cursor.first_end == 2, (
        "After 'a b x b x' the longest earlier suffix is 'b x', first ending at index 2.")


def test_negative_length_is_rejected():
    sam = SuffixAutomaton()
    sam.extend([1, 1])
    with pytest.raises(ConfigError):
        sam.earliest_continuation(1, -1)


def test_token_view_is_live_and_read_only():
    sam = SuffixAutomaton()
    view = sam.tokens
    sam.extend([4, 5, 6])
    assert view == [4, 5, 6] and view == (4, 5, 6), "The view should follow the text."
    assert view[1] == 5 and view[1:] == [5, 6], "Indexing and slicing should work on the view."
    assert not hasattr(view, "append"), "The view should not offer mutation."
