"""Pure rules over token-id sequences, shared by the engine, the drafters and (later) the app: where
generated text ends, and how far two sequences agree.

Contract: no state and no torch; inputs are never modified. `cut_generated` is the ONE stop and
truncation rule for generated tokens (the engine's loop, its result assembly and any partial result
apply it); `cut_at_stop` is its stop-token half, used by retrieval drafters so that a copied draft
never continues past a stop token (the stop token itself may be drafted).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence


def cut_at_stop(tokens: Sequence[int], stop_ids: Collection[int]) -> list[int]:
    """`tokens` up to and including the first stop token; all of them if there is none."""
    out = list(tokens)
    for i, t in enumerate(out):
        if t in stop_ids:
            return out[:i + 1]
    return out


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share (e.g. [1, 2, 3] and [1, 2, 4, 5] -> 2)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Cut:
    """Generated tokens after the stop/truncation rule, and which end (if any) was reached."""
    tokens: tuple[int, ...]
    reason: str | None          # "stop_token" | "limit" | None: neither reached, generation goes on


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first token where two outputs differ (one ending early differs at its end);
    None when they are identical."""
    n = common_prefix_len(a, b)
    return None if n == len(a) == len(b) else n


def cut_generated(tokens: Sequence[int], stop_ids: Collection[int], limit: int) -> Cut:
    """Keep at most `limit` tokens (max_new_tokens, or the context's room), then cut after the first
    stop token. The rule composes: applying it to a step's new tokens with the room left gives
    the same ends as applying it to everything generated so far."""
    out = list(tokens[:max(0, limit)])
    for i, t in enumerate(out):
        if t in stop_ids:
            return Cut(tuple(out[:i + 1]), "stop_token")
    return Cut(tuple(out), "limit" if len(out) >= limit else None)
