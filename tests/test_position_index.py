"""N-gram position index: property tests against brute force, plus unit cases."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import token_texts

from respec.errors import ConfigError
from respec.retrieval import MatchPosition, NgramPositionIndex, SuffixAutomaton

BIG = 10**9


def brute_match_at(hist: list[int], query: list[int], e: int, cap: int) -> int:
    """Largest m <= cap with hist[e-m+1 .. e] == query[-m:], by slicing."""
    m = 0
    while (m < min(cap, len(query), e + 1)
           and hist[e - m : e + 1] == query[len(query) - m - 1 :]):
        m += 1
    return m


def brute_ranking(hist: list[int], query: list[int], min_match: int, cap: int,
                  candidates: list[int] | None = None) -> list[MatchPosition]:
    """Every end e (with a continuation token) whose capped match is >= min_match, ranked."""
    ends = range(len(hist) - 1) if candidates is None else candidates
    found = [MatchPosition(e, brute_match_at(hist, query, e, cap)) for e in ends]
    found = [p for p in found if p.match_length >= min_match]
    return sorted(found, key=lambda p: (-p.match_length, -p.end))


histories = token_texts


# ----------------------------------------------------------------------------- properties
@settings(max_examples=80, deadline=None)
@given(histories(), st.integers(1, 10), st.integers(1, 8), st.integers(1, 40), st.data())
def test_every_occurrence_is_returned_with_its_true_match_length(data, min_match, qmax, cap,
                                                                 draw):
    alpha, hist = data
    root = draw.draw(st.sampled_from(alpha))
    index = NgramPositionIndex(qmax=qmax)
    index.extend(hist)
    seq = hist + [root]
    got = index.positions(seq, min_match=min_match, max_n=BIG, max_examined=BIG, cap=cap)
    want = brute_ranking(hist, seq, min_match, cap)
    assert got == want, (
        f"With no limits the index should return every occurrence, ranked: expected {want}, "
        f"got {got}.")
    for p in got:
        assert p.end <= len(hist) - 2, "Every position should have a continuation token."
        assert index.continuation(p.end, 3) == hist[p.end + 1 : p.end + 4], (
            "The continuation should be the history tokens right after the end index.")


@settings(max_examples=60, deadline=None)
@given(histories(), st.integers(1, 6), st.integers(0, 5), st.integers(0, 12), st.data())
def test_limits_keep_the_best_of_the_most_recent_candidates(data, min_match, max_n,
                                                            max_examined, draw):
    alpha, hist = data
    qmax, cap = 4, 32
    root = draw.draw(st.sampled_from(alpha))
    index = NgramPositionIndex(qmax=qmax)
    index.extend(hist)
    seq = hist + [root]
    q = min(min_match, qmax, len(seq))
    # Candidates: ends whose last q tokens match, most recent first, at most max_examined.
    keyed = [e for e in range(len(hist) - 2, -1, -1) if brute_match_at(hist, seq, e, BIG) >= q]
    want = brute_ranking(hist, seq, min_match, cap, keyed[:max_examined])[:max_n]
    got = index.positions(seq, min_match=min_match, max_n=max_n, max_examined=max_examined,
                          cap=cap)
    assert got == want, (
        f"The index should rank the {max_examined} most recent candidates and keep the top "
        f"{max_n}: expected {want}, got {got}.")


@settings(max_examples=60, deadline=None)
@given(histories(), st.integers(1, 8), st.integers(1, 20), st.data())
def test_a_suffix_of_the_sequence_is_an_equivalent_query(data, min_match, tail, draw):
    alpha, hist = data
    root = draw.draw(st.sampled_from(alpha))
    index = NgramPositionIndex()
    index.extend(hist)
    seq = hist + [root]
    query = seq[-tail:]
    got = index.positions(query, min_match=min_match, max_n=BIG, max_examined=BIG)
    want = brute_ranking(hist, seq, min_match, min(32, len(query)))
    assert got == want, (
        f"Querying with the last {tail} tokens should equal matching the full sequence with "
        f"the cap lowered to {min(32, len(query))}: expected {want}, got {got}.")


@settings(max_examples=40, deadline=None)
@given(histories(max_len=150), st.data())
def test_incremental_extension_agrees_with_the_suffix_automaton(data, draw):
    alpha, hist = data
    root = draw.draw(st.sampled_from(alpha))
    index, sam = NgramPositionIndex(), SuffixAutomaton()
    cut = draw.draw(st.integers(0, len(hist)))
    index.extend(hist[:cut])
    sam.extend(hist[:cut])
    for tok in hist[cut:]:
        index.append(tok)
        sam.append(tok)
    seq = hist + [root]
    longest = sam.peek(root).length
    got = index.positions(seq, min_match=1, max_n=BIG, max_examined=BIG, cap=BIG)
    best_with_continuation = max((p.match_length for p in got), default=0)
    assert best_with_continuation <= longest, (
        "No position can match longer than the automaton's longest match.")
    # The longest match is missing from the index only when it sits at the very end of the
    # history (no continuation token); the index excludes that one position.
    last_end = len(hist) - 1
    if best_with_continuation < longest:
        assert brute_match_at(hist, seq, last_end, BIG) == longest, (
            "The index may only miss the automaton's longest match at the final position.")
    if longest:
        assert sam.peek(root).first_end == min(
            [p.end for p in got if p.match_length == longest]
            + ([last_end] if brute_match_at(hist, seq, last_end, BIG) == longest else [])), (
            "The automaton's first occurrence should be the earliest end of the longest match.")


# ----------------------------------------------------------------------------- unit cases
def test_empty_index_returns_nothing():
    index = NgramPositionIndex()
    assert len(index) == 0 and index.tokens == [], "A new index should hold no history."
    assert index.positions([3], min_match=1, max_n=4) == [], (
        "An empty history has no earlier positions.")


def test_root_never_seen_gives_no_positions():
    index = NgramPositionIndex()
    index.extend([1, 2, 3, 1, 2])
    assert index.positions([1, 2, 3, 1, 2, 9], min_match=1, max_n=4) == [], (
        "A root token absent from the history should match nowhere.")


def test_final_position_is_excluded_and_ranking_is_by_length_then_recency():
    hist = [7, 1, 2, 5, 1, 2, 6, 0, 2, 8, 2]
    index = NgramPositionIndex(qmax=2)
    index.extend(hist)
    got = index.positions(hist + [2], min_match=1, max_n=10)
    # seq ends "8 2 2": index 10 (the last) has no continuation; 8, 5 and 2 each match one token.
    assert got == [MatchPosition(8, 1), MatchPosition(5, 1), MatchPosition(2, 1)], (
        f"Equal one-token matches should be ranked most recent first, and the final index "
        f"should be excluded: got {got}.")
    got = index.positions([5, 1, 2], min_match=2, max_n=10)
    assert got == [MatchPosition(5, 3), MatchPosition(2, 2)], (
        f"'5 1 2' ends at 5 and '1 2' at 2, while index 8 matches one token only: {got}.")
    got = index.positions([7, 1, 2], min_match=2, max_n=10)
    assert got == [MatchPosition(2, 3), MatchPosition(5, 2)], (
        f"A longer match should rank above a more recent one: {got}.")


def test_only_max_examined_most_recent_candidates_are_considered():
    index = NgramPositionIndex(qmax=4)
    hist = [1, 2] * 4
    index.extend(hist)
    got = index.positions(hist + [1], min_match=1, max_n=10, max_examined=2)
    assert got == [MatchPosition(6, 7), MatchPosition(4, 5)], (
        f"Only the two most recent candidates (ends 6 and 4) should be examined: {got}.")
    got = index.positions(hist + [1], min_match=1, max_n=10, max_examined=0)
    assert got == [], "Examining no candidate should return nothing."


def test_continuation_is_cut_at_the_end_of_the_history():
    index = NgramPositionIndex()
    index.extend([4, 5, 6, 7])
    assert index.continuation(1, 10) == [6, 7], "Only two tokens follow index 1."
    assert index.continuation(3, 2) == [], "Nothing follows the last index."
    with pytest.raises(ConfigError):
        index.continuation(4, 1)


def test_match_length_is_capped():
    index = NgramPositionIndex(qmax=3)
    hist = [1] * 20
    index.extend(hist)
    got = index.positions(hist + [1], min_match=1, max_n=3, cap=5)
    assert got == [MatchPosition(18, 5), MatchPosition(17, 5), MatchPosition(16, 5)], (
        f"Every match in a constant history should be capped at 5, most recent first: {got}.")


def test_bad_arguments_are_rejected():
    with pytest.raises(ConfigError):
        NgramPositionIndex(qmax=0)
    index = NgramPositionIndex()
    index.extend([1, 1, 1])
    with pytest.raises(ConfigError):
        index.positions([1], min_match=0, max_n=1)
    with pytest.raises(ConfigError):
        index.positions([], min_match=1, max_n=1)
    with pytest.raises(ConfigError):
        index.positions([1], min_match=1, max_n=1, cap=0)
