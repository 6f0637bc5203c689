"""Which compiled graph a target forward of n rows runs through, decided on this machine at
warm-up (respec/accel/compiled.py compiles them; respec/accel/target_compile.py
times them): pure choices over given times, and the variable that forces one.

Contract:
- `choose_buckets(buckets, time_pair)`: the static row counts worth padding trees to.
- `choose_eager_from(first_rows, time_pair)`: whether trees past the buckets run eagerly instead
  of through the symbolic-row graph; `forced_eager_from()` reads RESPEC_EAGER_FROM.
- `fastest_of_rounds(ways, run_ms, rounds)` (respec/models/timing.py, re-exported): how the checks
  time the ways they compare (also the head's output-layer routes and the verify-cost curve).
Nothing is measured by the choices; the callers pass the timings (tests pass given ones).
"""
from __future__ import annotations

from typing import Callable

from respec.accel.settings import read_settings
from respec.models.timing import fastest_of_rounds  # noqa: F401 (the checks' timing, re-exported)

# a bucket is kept where, at the fewest rows it serves (its worst case), its padded graph takes under
# 95% of the symbolic one's time (the fastest of 5 interleaved rounds each). At 0.9 the default
# model's 8-row graph was dropped on a 2-core AMD EPYC Zen 3 (float32, commit 3439365 of 2026-12-05) at 34.4 ms for 5
# rows padded against 37.5 unpadded (0.92), though padded it cost 34.4 ms at 8 rows against 44.0
BUCKET_MARGIN = 0.95


def choose_buckets(buckets: tuple[int, ...], time_pair: Callable[[int, int], tuple[float, float]],
                   margin: float = BUCKET_MARGIN) -> tuple[tuple[int, ...], dict[int, tuple[int, float, float]]]:
    """The buckets worth keeping, in ascending order, and what decided each: {bucket: (rows,
    padded ms, symbolic ms)}. `time_pair(bucket, rows)` times a forward of `rows` rows padded to
    `bucket` and unpadded (symbolic). Each bucket is judged at the fewest rows it would serve (3,
    or one more than the last bucket kept), where padding costs most: kept only if its padded
    forward takes under `margin` of the symbolic one's; a bucket dropped leaves its rows to the
    next. Pure given `time_pair` (tests pass given times)."""
    kept, why, lo = [], {}, 3
    for b in sorted(buckets):
        if b < lo:
            continue
        padded, symbolic = time_pair(b, lo)
        why[b] = (lo, padded, symbolic)
        if padded < margin * symbolic:
            kept.append(b)
            lo = b + 1
    return tuple(kept), why


#: trees past the static buckets run eagerly only where the eager forward takes under this share
#: of the symbolic-row graph's time at the fewest rows that graph would serve
EAGER_MARGIN = 0.8


def choose_eager_from(first_rows: int, time_pair: Callable[[int], tuple[float, float]],
                      margin: float = EAGER_MARGIN) -> tuple[int | None, tuple[int, float, float]]:
    """From how many rows on compiled trees run through the eager forward instead of the
    symbolic-row graph (None: never), and what decided it: (rows, symbolic ms, eager ms).
    `time_pair(rows)` times a tree forward of `rows` rows both ways; it is judged at `first_rows`,
    the fewest rows the symbolic graph serves (one more than the largest bucket). One size decides
    all: where the symbolic graph loses (bf16 GEMMs without bf16 instructions, commit 671c23f of 2026-12-07) it lost
    by the same ~9x at 9 to 64 rows; where it wins it won at every size measured (commits f69a29f (2026-12-03) to dca698b (2026-12-06)).
    Pure given `time_pair` (tests pass given times)."""
    symbolic, eager = time_pair(first_rows)
    return (first_rows if eager < margin * symbolic else None), (first_rows, symbolic, eager)


def forced_eager_from() -> int | None | str:
    """RESPEC_EAGER_FROM: "off" (trees past the buckets always run compiled), a row count (they run
    eagerly from there), or "" when unset (measured: `choose_eager_from`); ConfigError (a
    ValueError) naming it otherwise (respec/accel/settings.py)."""
    return read_settings().eager_from
