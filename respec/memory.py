"""What a runner carries from one request to the next.

Contract: `RunnerMemory` holds the `suffix` method's trees (`SuffixMemory`: SuffixDecoding's
global tree of earlier responses) and the earlier answers ReSpec's cross-request memory reads
(`AnswerMemory`; every run's answer is added by `Runner.generate` / `Runner.stream`). A `Runner`
owns one; `run_bench` gives each method and repeat its own, so a benchmark's records never see
another method's answer to the same question. Nothing at import.
"""
from __future__ import annotations

from respec.drafters.suffix import SuffixMemory
from respec.retrieval.answers import AnswerMemory


class RunnerMemory:
    def __init__(self) -> None:
        self.suffix = SuffixMemory()
        self.answers = AnswerMemory()
