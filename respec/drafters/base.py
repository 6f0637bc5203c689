"""The drafter seam: a small Protocol every drafting policy implements.

Contract: the engine calls `reset(prompt, prompt_hidden)` once per request, then per step
`propose(ctx)` -> Proposal (a DraftTree rooted at ctx.root plus the decision records the UI shows),
and after verification `observe(outcome)` with what was committed, so the drafter can extend its
indexes, update scores and queue hidden states for EAGLE catch-up. A drafter never touches the
target's KV cache and never decides acceptance; it only proposes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import torch

from respec.tree import DraftTree
from respec.verify import Verdict

if TYPE_CHECKING:
    from respec.cost import CostModel


@dataclass(frozen=True)
class DraftContext:
    tokens: Sequence[int]          # committed tokens: prompt + generated (the root NOT included)
    root: int                      # x0: chosen by the target, not yet fed
    entropies: Sequence[float]     # nats; entropy of the distribution that produced each generated
                                   # token, the root's last (prompt positions excluded)
    max_nodes: int                 # tree size cap for this step (context room), root included
    cost: "CostModel | None" = None  # this request's cost model (tree.auto), None = fixed sizes


@dataclass(frozen=True)
class Decision:
    """Why the drafter chose its source this step (SAM: the match-length rule; ReSpec adds the
    entropy trigger fields). Stored verbatim in the trace."""
    source: str                              # "retrieval" | "eagle" | "none"
    reason: str                              # one human sentence, e.g. "match 7 ≥ 5 → retrieval"
    match_len: int = 0                       # suffix-automaton match with the root
    fired: bool | None = None                # entropy trigger outcome (ReSpec), None if not used
    window: tuple[float, ...] = ()           # the entropies the trigger looked at, oldest first
    k_star: int | None = None
    mean_entropy: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Proposal:
    tree: DraftTree
    source: str                              # "retrieval" | "eagle" | "none" (root only)
    decision: Decision | None = None
    candidates: tuple[dict, ...] = ()        # retrieval candidates considered (ReSpec), JSON-ready


@dataclass(frozen=True)
class StepOutcome:
    proposal: Proposal
    verdict: Verdict
    committed: Sequence[int]                 # root + accepted draft tokens
    committed_hidden: torch.Tensor | None    # [len(committed), H] final-norm features (catch-up)
    next_root: int                           # the bonus / recovered token
    verify_ms: float | None = None           # wall time of this step's target forward + verification


class Drafter(Protocol):
    name: str
    needs_hidden: bool                       # whether the engine must return target features

    def reset(self, prompt: Sequence[int], prompt_hidden: torch.Tensor | None) -> None: ...

    def propose(self, ctx: DraftContext) -> Proposal: ...

    def observe(self, outcome: StepOutcome) -> tuple[dict, ...] | None:
        """Return the proposal's candidate records completed with their outcome, or None."""
