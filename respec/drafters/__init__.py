"""Drafter registry: method name -> drafter instance for a loaded target.

`make_drafter(method, target, config, head=None)` builds the drafter of a method. EAGLE-based
methods use `head` if given, else a seeded random head (lossless but accepts little). The ReSpec
family (respec, respec-strict and the ablations) is one drafter with the parts of its method's
`respec.drafters.respec.VARIANTS` entry; respec-no-model builds no EAGLE drafter. `suffix` is
SuffixDecoding through arctic-inference (respec/drafters/suffix.py): ConfigError in one line where
that package cannot be imported.
"""
from __future__ import annotations

from respec.config import METHODS, EngineConfig
from respec.drafters.base import Candidate, CandidateOutcome, Decision, DraftContext, Drafter, Proposal, StepOutcome
from respec.drafters.eagle2 import Eagle2Drafter
from respec.drafters.heads.eagle import random_head
from respec.drafters.respec import VARIANTS, ReSpecDrafter
from respec.drafters.sam import SamDrafter
from respec.drafters.suffix import SuffixDrafter, SuffixMemory
from respec.drafters.vanilla import VanillaDrafter
from respec.errors import ConfigError

__all__ = ["Candidate", "CandidateOutcome", "Decision", "DraftContext", "Drafter", "Proposal", "StepOutcome",
           "make_drafter"]


def make_drafter(method: str, target, config: EngineConfig, head=None, memory=None) -> Drafter:
    """`memory`: the runner's RunnerMemory (the `suffix` method's trees, ReSpec's earlier answers
    and the EAGLE head's back-off across requests; nothing carried over when None)."""

    if method not in METHODS:
        raise ConfigError(f"method {method!r} is not available; choose one of {', '.join(METHODS)}")
    if method == "vanilla":
        return VanillaDrafter()
    if method == "suffix":
        return SuffixDrafter(config.suffix, memory.suffix if memory is not None else SuffixMemory(),
                             stop_token_ids=target.eos_token_ids)
    answers = memory.answers if memory is not None else None
    variant = VARIANTS.get(method)
    if variant is not None and not variant.fallback:       # retrieval only: no EAGLE head at all
        return ReSpecDrafter(None, config, variant=variant, name=method, stop_token_ids=target.eos_token_ids,
                             answers=answers)
    backoff = None if memory is None else memory.head_backoff(method, target.describe_forward().mode)
    eagle = Eagle2Drafter(target, head if head is not None else random_head(target), config.tree, backoff=backoff)
    if method == "eagle2":
        return eagle
    if method == "sam":
        return SamDrafter(eagle, config.sam, stop_token_ids=target.eos_token_ids)
    if variant is None:
        raise ConfigError(f"method {method!r} has no drafter")
    return ReSpecDrafter(eagle, config, variant=variant, name=method, stop_token_ids=target.eos_token_ids,
                         answers=answers)
