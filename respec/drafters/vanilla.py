"""Vanilla decoding through the speculative loop: every proposal is the root alone, so each step is
one ordinary decode step (one token from the target per forward)."""
from __future__ import annotations

from typing import Sequence

import torch

from respec.drafters.base import DraftContext, Proposal, StepOutcome
from respec.tree import DraftTree


class VanillaDrafter:
    name = "vanilla"
    needs_hidden = False
    feature_layers = None

    def reset(self, prompt: Sequence[int], prompt_hidden: torch.Tensor | None) -> None:
        pass

    def propose(self, ctx: DraftContext) -> Proposal:
        return Proposal(tree=DraftTree.root_only(ctx.root), source="none")

    def observe(self, outcome: StepOutcome) -> None:
        pass
