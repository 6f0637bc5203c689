"""How the project times alternatives on a shared machine: interleaved rounds, the fastest kept.

Contract: `fastest_of_rounds(ways, run_ms, rounds, pause=None)` -> the fastest ms of each way over
`rounds` interleaved rounds after one untimed round. Pure given `run_ms`; used by the verify-cost
curve (respec/models/hf.py) and by the speed machinery's checks (respec/accel/).
"""
from __future__ import annotations

from typing import Callable


def fastest_of_rounds(ways: list, run_ms: Callable[[object], float], rounds: int,
                      pause: Callable[[], None] | None = None) -> tuple[float, ...]:
    """The fastest ms of each of `ways` over `rounds` interleaved rounds (`run_ms(way)` runs and
    times one call that way), after one untimed round (the first call of a shape pays allocation);
    `pause` is called before each round. Interleaving keeps a machine's drift out of the comparison."""
    best = [float("inf")] * len(ways)
    for r in range(rounds + 1):
        if pause is not None:
            pause()
        for i, way in enumerate(ways):
            ms = run_ms(way)
            if r:
                best[i] = min(best[i], ms)
    return tuple(best)
