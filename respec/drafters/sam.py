"""SAM-Decoding baseline (ALGORITHMS.md §3): a dynamic suffix automaton over prompt + generated
tokens drafts a chain copied after the EARLIEST earlier occurrence of the longest matching suffix
when that match (including the root) is at least `len_threshold` tokens; otherwise the EAGLE-2 tree
drafts. The static automaton of the SAM paper is not used (Spec-Bench disables it too).

Contract: retrieved chains never continue past a stop token (the stop token itself may be drafted),
and never exceed the step's node cap. The inner EAGLE-2 drafter is kept in sync on every step
(catch-up), whichever source drafted.
"""
from __future__ import annotations

from typing import Sequence

import torch

from respec.config import SamConfig
from respec.drafters.base import Decision, DraftContext, Proposal, StepOutcome
from respec.drafters.eagle2 import Eagle2Drafter, capped_tree_config
from respec.retrieval import SuffixAutomaton
from respec.tree import DraftTree


class SamDrafter:
    name = "sam"
    needs_hidden = True

    def __init__(self, eagle: Eagle2Drafter, cfg: SamConfig, stop_token_ids: frozenset[int] = frozenset()) -> None:
        self.eagle = eagle
        self.cfg = cfg
        self.stop = frozenset(stop_token_ids)
        self.sam = SuffixAutomaton()

    def reset(self, prompt: Sequence[int], prompt_hidden: torch.Tensor | None) -> None:
        self.sam = SuffixAutomaton()
        self.sam.extend(prompt)
        self.eagle.reset(prompt, prompt_hidden)

    def propose(self, ctx: DraftContext) -> Proposal:
        # 1. Longest suffix of committed + [root] seen earlier, and its earliest continuation.
        n = min(self.cfg.n_predicts, ctx.max_nodes - 1)
        cont = self.sam.earliest_continuation(ctx.root, n) if n > 0 else None
        match = self.sam.peek(ctx.root).length
        # 2. Long enough -> retrieval chain; the EAGLE head still catches up (its KV must stay in sync).
        if cont is not None and match >= self.cfg.len_threshold and cont.tokens:
            draft = list(cont.tokens)
            for i, t in enumerate(draft):
                if t in self.stop:
                    draft = draft[:i + 1]
                    break
            tree = DraftTree.chain(ctx.root, draft, "retrieval")
            decision = Decision(source="retrieval", match_len=match,
                                reason=f"match {match} ≥ {self.cfg.len_threshold} → copy {len(draft)} "
                                       f"tokens after position {cont.end}",
                                extra={"copy_from": cont.end, "match_used": cont.match_length})
            return Proposal(tree=tree, source="retrieval", decision=decision)
        # 3. Otherwise the EAGLE-2 tree.
        tree = self.eagle.draft_tree(ctx.tokens, ctx.root, capped_tree_config(self.eagle.tree_cfg, ctx.max_nodes))
        auto = self.eagle.last_auto
        decision = Decision(source="eagle", match_len=match,
                            reason=f"match {match} < {self.cfg.len_threshold} → EAGLE-2 tree"
                                   + (f" ({auto['reason']})" if auto else ""),
                            extra={"eagle_auto": auto} if auto else {})
        return Proposal(tree=tree, source="eagle" if tree.num_draft else "none", decision=decision)

    def observe(self, outcome: StepOutcome) -> None:
        self.sam.extend(outcome.committed)
        self.eagle.observe(outcome)

