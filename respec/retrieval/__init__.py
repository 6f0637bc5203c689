"""Retrieval structures for drafting from the context: the suffix automaton (longest earlier
match, SAM-Decoding) and the n-gram position index (every earlier match, ReSpec). Pure Python."""
from __future__ import annotations

from respec.retrieval.position_index import MatchPosition, NgramPositionIndex
from respec.retrieval.suffix_automaton import (
    ROOT,
    Continuation,
    Match,
    State,
    SuffixAutomaton,
    TokenView,
)

__all__ = [
    "ROOT",
    "Continuation",
    "Match",
    "MatchPosition",
    "NgramPositionIndex",
    "State",
    "SuffixAutomaton",
    "TokenView",
]
