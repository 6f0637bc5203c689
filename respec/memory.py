"""What a runner carries from one request to the next.

Contract: `RunnerMemory` holds the `suffix` method's trees (`SuffixMemory`: SuffixDecoding's
global tree of earlier responses), the earlier answers ReSpec's cross-request memory reads
(`AnswerMemory`; every run's answer is added by `Runner.generate` / `Runner.stream`), and, per
method and forward (compiled or eager), where the EAGLE head's sit-out stood after the last step
(`HeadBackoff`, respec/drafters/eagle2.py): every request still probes a switched-off head at its
start, but a refusal there backs off as far as the last request's had grown instead of starting
again at two steps. A `Runner` owns one; `run_bench` gives each method and repeat its own, so a
benchmark's records never see another method's answer to the same question.
Nothing at import.
"""
from __future__ import annotations

from dataclasses import dataclass

from respec.drafters.suffix import SuffixMemory
from respec.retrieval.answers import AnswerMemory


@dataclass
class HeadBackoff:
    """The EAGLE head's state after a runner's last step: `off` (switched off, to be probed) and
    its `misses` in a row, which set how long its next refusal sits out (2^misses steps)."""
    misses: int = 0
    off: bool = False


class RunnerMemory:
    def __init__(self) -> None:
        self.suffix = SuffixMemory()
        self.answers = AnswerMemory()
        self._backoff: dict[tuple[str, str], HeadBackoff] = {}

    def head_backoff(self, method: str, forward: str) -> HeadBackoff:
        """The head's back-off record for `method` on a "compiled" or "eager" forward
        (`ForwardInfo.mode`; created empty): a compiled and an eager step price drafting
        differently, so neither inherits the other's."""
        return self._backoff.setdefault((method, forward), HeadBackoff())
