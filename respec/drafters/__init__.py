"""Drafter registry: method name -> drafter instance for a loaded target.

`make_drafter(method, target, config, head=None)` builds the drafter of a method. EAGLE-based
methods use `head` if given, else a seeded random head (lossless but accepts little).
"""
from __future__ import annotations

from respec.config import IMPLEMENTED_METHODS, EngineConfig
from respec.drafters.base import Decision, DraftContext, Drafter, Proposal, StepOutcome
from respec.errors import ConfigError

__all__ = ["Decision", "DraftContext", "Drafter", "Proposal", "StepOutcome", "make_drafter"]


def make_drafter(method: str, target, config: EngineConfig, head=None) -> Drafter:
    from respec.drafters.eagle2 import Eagle2Drafter, random_head
    from respec.drafters.respec import ReSpecDrafter
    from respec.drafters.sam import SamDrafter
    from respec.drafters.vanilla import VanillaDrafter

    if method not in IMPLEMENTED_METHODS:
        raise ConfigError(f"method {method!r} is not available; choose one of {', '.join(IMPLEMENTED_METHODS)}")
    if method == "vanilla":
        return VanillaDrafter()
    eagle = Eagle2Drafter(target, head if head is not None else random_head(target), config.tree)
    if method == "eagle2":
        return eagle
    if method == "sam":
        return SamDrafter(eagle, config.sam, stop_token_ids=target.eos_token_ids)
    return ReSpecDrafter(eagle, config, name=method, stop_token_ids=target.eos_token_ids,
                         trigger="match" if method == "respec-no-trigger" else "entropy",
                         ema=method != "respec-no-ema")
