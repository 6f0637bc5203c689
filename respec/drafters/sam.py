"""SAM-Decoding baseline (ALGORITHMS.md §3): a dynamic suffix automaton over prompt + generated
tokens drafts a chain copied after the EARLIEST earlier occurrence of the longest matching suffix
when that match (including the root) is at least `len_threshold` tokens; otherwise the EAGLE-2 tree
drafts. The static automaton of the SAM paper is not used (Spec-Bench disables it too).

With a cost model (`tree.auto`) the chain is cut to the length that pays: node i's probability is
c^i, c the continuation rate learned from this request's verified chains per match-length bucket
(respec/cost.py `ContinuationEstimator`); when no length pays, the EAGLE-2 tree drafts instead.

Contract: retrieved chains never continue past a stop token (the stop token itself may be drafted),
and never exceed the step's node cap. The inner EAGLE-2 drafter is kept in sync on every step
(catch-up), whichever source drafted.
"""
from __future__ import annotations

import time
from typing import Sequence

import torch

from respec.config import SamConfig
from respec.cost import AutoDecision, ContinuationEstimator, trie_node_probs
from respec.drafters.base import Decision, DraftContext, Proposal, StepOutcome
from respec.drafters.eagle2 import Eagle2Drafter
from respec.retrieval import SuffixAutomaton
from respec.tokens import cut_at_stop
from respec.tree import DraftTree


class SamDrafter:
    name = "sam"
    needs_hidden = True

    def __init__(self, eagle: Eagle2Drafter, cfg: SamConfig, stop_token_ids: frozenset[int] = frozenset()) -> None:
        self.eagle = eagle
        self.feature_layers = eagle.feature_layers
        self.cfg = cfg
        self.stop = frozenset(stop_token_ids)
        self.sam = SuffixAutomaton()
        self.continuation = ContinuationEstimator()
        self._last_match: int | None = None

    def reset(self, prompt: Sequence[int], prompt_hidden: torch.Tensor | None) -> None:
        self.sam = SuffixAutomaton()
        self.continuation = ContinuationEstimator()
        self._last_match = None
        self.sam.extend(prompt)
        self.eagle.reset(prompt, prompt_hidden)

    def propose(self, ctx: DraftContext) -> Proposal:
        t0 = time.perf_counter()
        self._last_match = None
        # 1. Longest suffix of committed + [root] seen earlier, and its earliest continuation.
        n = min(self.cfg.n_predicts, ctx.max_nodes - 1)
        cont = self.sam.earliest_continuation(ctx.root, n) if n > 0 else None
        match = self.sam.peek(ctx.root).length
        note = ""
        # 2. Long enough -> retrieval chain, cut by the cost model to the length that pays; the
        #    EAGLE head still catches up later (its KV must stay in sync).
        if cont is not None and match >= self.cfg.len_threshold and cont.tokens:
            draft = cut_at_stop(cont.tokens, self.stop)
            tree = DraftTree.chain(ctx.root, draft, "retrieval")
            plan = None
            if ctx.cost is not None:
                rate = self.continuation.rate(match)
                probs = trie_node_probs(tree.parents, [1.0] * tree.size, rate)
                plan = ctx.cost.plan("retrieval", probs[1:], (time.perf_counter() - t0) * 1000)
                tree = tree.subtree(range(1, plan.size))
            if tree.num_draft:
                self._last_match = match
                extra = {"copy_from": cont.end, "match_used": cont.match_length}
                if plan is not None:
                    extra["cost"] = AutoDecision(plan=plan, continuation=rate).to_dict()
                decision = Decision(source="retrieval", match_len=match,
                                    reason=f"match {match} ≥ {self.cfg.len_threshold} → copy {tree.num_draft} "
                                           f"tokens after position {cont.end}"
                                           + (f" (cost model: {len(draft)} offered, expected "
                                              f"{plan.expected_tokens:.2f} tokens at {plan.rate_vs_plain:.2f}x "
                                              f"a plain step)" if plan is not None else ""),
                                    extra=extra)
                return Proposal(tree=tree, source="retrieval", decision=decision)
            note = (f"match {match} ≥ {self.cfg.len_threshold}, but no copied length pays "
                    f"(continuation {rate:.2f}) → EAGLE-2 tree")
        # 3. Otherwise the EAGLE-2 tree.
        eagle = self.eagle.draft(ctx)
        auto = eagle.auto
        reason = note or f"match {match} < {self.cfg.len_threshold} → EAGLE-2 tree"
        decision = Decision(source="eagle", match_len=match,
                            reason=reason + (f" ({auto.reason})" if auto else ""),
                            extra={"cost": auto.to_dict()} if auto else {})
        return Proposal(tree=eagle.tree, source="eagle" if eagle.tree.num_draft else "none", decision=decision)

    def observe(self, outcome: StepOutcome) -> None:
        if outcome.proposal.source == "retrieval" and self._last_match is not None:
            self.continuation.update(self._last_match, outcome.proposal.tree.parents, outcome.verdict.path)
        self._last_match = None
        self.sam.extend(outcome.committed)
        self.eagle.observe(outcome)
