"""The drafter seam: a small Protocol every drafting policy implements.

Contract: the engine calls `reset(prompt, prompt_hidden)` once per request, then per step
`propose(ctx)` -> Proposal (a DraftTree rooted at ctx.root plus the decision records the UI shows),
and after verification `observe(outcome)` with what was committed, so the drafter can extend its
indexes, update scores and queue hidden states for EAGLE catch-up; it returns the proposal's
candidates with their outcomes as new records. A drafter never touches the target's KV cache and
never decides acceptance; it only proposes. Every record crossing this seam is a frozen dataclass
(`Candidate`, `CandidateOutcome`, `Decision`, respec.cost `AutoDecision`); the trace stores their
`to_dict()` forms.
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
class CandidateOutcome:
    """What verification made of one retrieval candidate (filled in by the drafter's `observe`)."""
    accepted: int                            # leading tokens of its proposed draft the target accepted
    score_after: float | None                # its score after the EMA update, None without feedback


@dataclass(frozen=True)
class Candidate:
    """One earlier match position a retrieval drafter considered this step (ReSpec). Records are
    immutable: choosing, trie membership and the outcome each make a new one
    (dataclasses.replace). `to_dict` is the trace's JSON record: a key is present exactly when its
    stage happened (draft/proposed once chosen, accepted/score_after once observed)."""
    end_pos: int                             # position e in the committed tokens where the match ends
    match_len: int                           # matched suffix length there (the root included)
    inherited_from: int | None               # e' whose score e inherited (ReSpec's span feedback)
    score_before: float | None               # S_e when chosen (None: the variant keeps no score)
    qualified: bool                          # S_e >= θ_score (always True without a score filter)
    draft: tuple[int, ...] | None = None     # the tokens it offers (None: not chosen)
    proposed: int | None = None              # leading draft tokens that made it into the trie
    outcome: CandidateOutcome | None = None
    origin: str = "context"                  # "context" (this request) | "memory" (an earlier answer:
                                             # end_pos = -(1 + its position in the memory corpus))

    def to_dict(self) -> dict:
        d = {"end_pos": self.end_pos, "match_len": self.match_len, "inherited_from": self.inherited_from,
             "score_before": self.score_before, "qualified": self.qualified}
        if self.origin != "context":
            d["origin"] = self.origin
        if self.draft is not None:
            d["draft"] = list(self.draft)
        if self.proposed is not None:
            d["proposed"] = self.proposed
        if self.outcome is not None:
            d.update(accepted=self.outcome.accepted, score_after=self.outcome.score_after)
        return d


@dataclass(frozen=True)
class Proposal:
    tree: DraftTree
    source: str                              # "retrieval" | "eagle" | "none" (root only)
    decision: Decision | None = None
    candidates: tuple[Candidate, ...] = ()   # retrieval candidates considered (ReSpec)


@dataclass(frozen=True)
class StepOutcome:
    proposal: Proposal
    verdict: Verdict
    committed: Sequence[int]                 # root + accepted draft tokens
    committed_hidden: torch.Tensor | None    # [len(committed), F] target features (catch-up; F = H, or 3H for EAGLE-3)
    next_root: int                           # the bonus / recovered token
    verify_ms: float | None = None           # wall time of this step's target forward + verification


class Drafter(Protocol):
    name: str
    needs_hidden: bool                       # whether the engine must return target features
    feature_layers: tuple[int, ...] | None   # which: None = final norm; EAGLE-3 = these layers' inputs

    def reset(self, prompt: Sequence[int], prompt_hidden: torch.Tensor | None) -> None: ...

    def propose(self, ctx: DraftContext) -> Proposal: ...

    def observe(self, outcome: StepOutcome) -> tuple[Candidate, ...] | None:
        """Return the proposal's candidates with their outcomes (new records), or None when the
        proposal's candidates stand as they are."""
