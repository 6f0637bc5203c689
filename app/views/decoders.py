"""Token ids -> text, live or replayed: the two decoders every view renders through. No Gradio.

Contract: a decoder has `pieces(tokens) -> list[str]` (the text each generated token added, so the
pieces of an output join to its text) and `piece(token) -> str` (one token on its own, for tree
nodes and candidates). `TokenizerDecoder` decodes with the model's tokenizer while a run streams;
`TableDecoder` replays from the text table a trace embeds in `meta["display"]` (`text_table`), so
a recorded or uploaded trace renders exactly what the live tokenizer rendered, with no model.
`decoder_for(result, tokenizer)` picks the right one for a trace.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    from respec.trace import GenerationResult


class TokenizerDecoder:
    """Live decoding with a tokenizer. `pieces` uses cumulative differences
    (piece i = decode(t[:i+1])[len(decode(t[:i])):]) so leading spaces and multi-byte characters
    survive (a character split over two tokens shows on the second); the prefix texts are cached,
    so streaming costs one decode per new token."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._ids: list[int] = []
        self._texts: list[str] = [""]          # _texts[i] = decode(_ids[:i])
        self._single: dict[int, str] = {}

    def _decode(self, ids: Sequence[int]) -> str:
        # A trailing U+FFFD is an incomplete multi-byte character: hold it back until the bytes
        # that complete it arrive (the token that completes it shows the whole character).
        return self.tokenizer.decode(list(ids), skip_special_tokens=True).rstrip("\ufffd")

    def pieces(self, tokens: Sequence[int]) -> list[str]:
        tokens = [int(t) for t in tokens]
        keep = 0                                # reuse the cached prefix that still matches
        while keep < min(len(tokens), len(self._ids)) and tokens[keep] == self._ids[keep]:
            keep += 1
        del self._ids[keep:]
        del self._texts[keep + 1:]
        for t in tokens[keep:]:
            self._ids.append(t)
            self._texts.append(self._decode(self._ids))
        out = []
        for i in range(len(tokens)):
            prev, cur = self._texts[i], self._texts[i + 1]
            out.append(cur[len(os.path.commonprefix([prev, cur])):])   # = cur[len(prev):] when cur extends prev
        return out

    def piece(self, token: int) -> str:
        token = int(token)
        if token not in self._single:
            self._single[token] = self.tokenizer.decode([token], skip_special_tokens=False)
        return self._single[token]


class TableDecoder:
    """Replay decoding from a trace's embedded text table (no tokenizer): the output pieces of the
    run, and a vocabulary of every token id the trace mentions."""

    def __init__(self, tokens: Sequence[int] = (), pieces: Sequence[str] = (),
                 vocab: Mapping[int, str] | None = None) -> None:
        self.tokens = [int(t) for t in tokens]
        self._pieces = list(pieces)
        self.vocab = {int(k): str(v) for k, v in (vocab or {}).items()}

    @classmethod
    def from_table(cls, tokens: Sequence[int], table: Mapping[str, Any]) -> TableDecoder:
        """The decoder of a `text_table` block (as embedded in a trace's meta["display"])."""
        return cls(tokens, table["pieces"], table.get("vocab") or {})

    def pieces(self, tokens: Sequence[int]) -> list[str]:
        tokens = [int(t) for t in tokens]
        if len(self._pieces) >= len(tokens) and self.tokens[:len(tokens)] == tokens:
            return self._pieces[:len(tokens)]
        return [self.piece(t) for t in tokens]

    def piece(self, token: int) -> str:
        return self.vocab.get(int(token), f"⟨{int(token)}⟩")


def trace_token_ids(result: GenerationResult) -> set[int]:
    """Every token id a trace mentions: its output, tree nodes, next tokens and candidates' drafts."""
    ids = set(result.tokens)
    for s in result.steps:
        ids.update(s.tree.tokens)
        ids.add(s.verdict.next_token)
        for c in s.candidates:
            for key in ("tokens", "draft", "proposed_tokens"):
                v = c.get(key)
                if isinstance(v, (list, tuple)):
                    ids.update(int(t) for t in v if isinstance(t, int))
    return ids


def text_table(result: GenerationResult, decoder) -> dict:
    """The JSON block embedded in a trace's meta ("display") so replay needs no tokenizer."""
    return {"pieces": decoder.pieces(result.tokens),
            "vocab": {str(t): decoder.piece(t) for t in sorted(trace_token_ids(result))}}


def decoder_for(result: GenerationResult, tokenizer=None):
    """The decoder of a run: its embedded table if it has one, else the tokenizer, else token ids
    (a `TableDecoder` with no table shows each token as ⟨id⟩)."""
    table = (result.meta or {}).get("display")
    if isinstance(table, Mapping) and isinstance(table.get("pieces"), list):
        return TableDecoder.from_table(result.tokens, table)
    if tokenizer is not None:
        return TokenizerDecoder(tokenizer)
    return TableDecoder()
