"""What a runner carries from one request to the next.

Contract: `RunnerMemory` holds the `suffix` method's trees (`SuffixMemory`: SuffixDecoding's
global tree of earlier responses), the earlier answers ReSpec's cross-request memory reads
(`AnswerMemory`; every run's answer is added by `Runner.generate` / `Runner.stream`), and, per
method and forward (compiled or eager), where the EAGLE head's sit-out stood after the last step
(`HeadBackoff`, respec/drafters/eagle2.py): a head switched off because it did not pay sits out
the rest of its back-off in the next request instead of paying a fresh probe at every request's
start (a prompt's catch-up included). A `Runner` owns one; `run_bench` gives each method and
repeat its own, so a benchmark's records never see another method's answer to the same question.
Nothing at import.
"""
from __future__ import annotations

from dataclasses import dataclass

from respec.drafters.suffix import SuffixMemory
from respec.retrieval.answers import AnswerMemory


@dataclass
class HeadBackoff:
    """The EAGLE head's back-off after a runner's last step: `misses` in a row and `skip` steps
    still to sit out (0: the head was drafting, or due to probe; the next request probes first)."""
    misses: int = 0
    skip: int = 0


class RunnerMemory:
    def __init__(self) -> None:
        self.suffix = SuffixMemory()
        self.answers = AnswerMemory()
        self._backoff: dict[tuple[str, bool], HeadBackoff] = {}

    def head_backoff(self, method: str, compiled: bool) -> HeadBackoff:
        """The head's back-off record for `method` on a compiled or eager forward (created empty):
        a compiled and an eager step price drafting differently, so neither inherits the other's."""
        return self._backoff.setdefault((method, bool(compiled)), HeadBackoff())
