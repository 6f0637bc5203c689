"""ReSpec drafting policy (ALGORITHMS.md §1): WHEN to retrieve (entropy trigger), WHAT to retrieve
(every earlier match position, ranked by an EMA of past acceptance, merged into one trie), and the
EAGLE-2 fallback. HOW to verify (relaxed for retrieval nodes) lives in respec/verify.py; the engine
applies it for the relaxed methods.

Contract: `propose` records every decision (trigger inputs and outcome, each candidate with its match
length and score, whether the fallback fired and why) in the Proposal, candidates as frozen
`Candidate` records; `observe` returns new records carrying their `CandidateOutcome` (tokens
accepted, score after the EMA update). The trie keeps
its most probable nodes (continuation rate x candidate scores, see `_trie`), as many as the cost
model says pay (tree.auto) or the trie budget holds. The inner EAGLE-2
drafter is kept in sync on every step (catch-up), whichever source drafted.

Cross-request memory (`candidates.memory_tokens` > 0): the newest earlier answers of the runner
(respec/retrieval/answers.py), within that many tokens, are searched beside the context; their
positions are candidates like any other (scored, inherited, ranked; a context position wins a
tie), keyed -(1 + position) and tagged `origin="memory"` so the explorer says "an earlier answer".

Variants (`Variant`, one per method in `VARIANTS`; the ablations remove one part each):
- `trigger`: "entropy" (ReSpec's gate), "off" (no gate: retrieve whenever a match >= L_min exists;
  the gate's would-be outcome is kept in the decision's extra) or "match" (legacy
  respec-no-trigger: SAM-Decoding's rule, match length >= sam.len_threshold);
- `selection`: "ema" (all positions, S >= θ_score, top-K by EMA score), "recency" (no feedback:
  the same positions and K, ranked by match length then recency, every score fixed at S0, so
  lengths are round(L_max · S0), no score filter, no EMA update, no inheritance) or "earliest"
  (legacy respec-no-ema: the earliest occurrence only, K = 1, length L_max, no score);
- `fallback`: True (EAGLE-2 drafts when retrieval does not) or False (retrieval only: a root-only
  step instead; no EAGLE head is built or kept in sync).
Letters: l (window), λ_e, θ_H, α, S0, θ_score, K, L_max, L_min as in ALGORITHMS.md.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from respec.config import CandidateConfig, EngineConfig, TriggerConfig
from respec.cost import AutoDecision, ContinuationEstimator, SizePlan, ancestor_closed_order, trie_node_probs
from respec.drafters.base import Candidate, CandidateOutcome, Decision, DraftContext, Proposal, StepOutcome
from respec.drafters.eagle2 import Eagle2Drafter
from respec.retrieval import NgramPositionIndex, SuffixAutomaton
from respec.retrieval.answers import AnswerMemory, MemoryIndex
from respec.tokens import common_prefix_len, cut_at_stop
from respec.tree import DraftTree

QUERY_TAIL = 40          # tokens of hist + [root] handed to the position index (> its cap of 32)


@dataclass(frozen=True)
class Variant:
    """Which parts of ReSpec a method keeps (see the module docstring)."""
    trigger: str = "entropy"      # "entropy" | "off" | "match"
    selection: str = "ema"        # "ema" | "recency" | "earliest"
    fallback: bool = True         # EAGLE-2 when retrieval does not draft; False = a root-only step

    def __post_init__(self) -> None:
        if self.trigger not in ("entropy", "off", "match"):
            raise ValueError(f"unknown trigger {self.trigger!r}")
        if self.selection not in ("ema", "recency", "earliest"):
            raise ValueError(f"unknown selection {self.selection!r}")


#: The ReSpec family: method -> the parts it keeps. respec-strict differs from respec only in
#: verification (it is not in RELAXED_METHODS), so it drafts like respec.
VARIANTS: dict[str, Variant] = {
    "respec": Variant(),
    "respec-strict": Variant(),
    "respec-no-gate": Variant(trigger="off"),
    "respec-no-feedback": Variant(selection="recency"),
    "respec-no-model": Variant(fallback=False),
    "respec-no-trigger": Variant(trigger="match"),            # legacy
    "respec-no-ema": Variant(selection="earliest"),           # legacy
}


# ---------------------------------------------------------------------------- pure pieces
@dataclass(frozen=True)
class TriggerResult:
    fired: bool
    window: tuple[float, ...]     # the last min(l, len) entropies, oldest first
    k_star: int                   # chosen window length
    mean_entropy: float           # H̄_{k*}
    scores: tuple[float, ...]     # C_1 .. C_l


def entropy_trigger(entropies: Sequence[float], cfg: TriggerConfig) -> TriggerResult:
    """C_k = H̄_k + λ_e / k over the last k = 1..l entropies; k* = argmin C_k (ties -> smaller k);
    fire iff H̄_{k*} <= θ_H. Worked example (l=3, λ_e=1): H = 2.0, 0.6, 0.9 -> C = 1.9, 1.25, 1.5,
    k* = 2, H̄ = 0.75 -> fires at θ_H = 1.5."""
    hist = list(entropies)[-cfg.window:]
    if not hist:
        return TriggerResult(False, (), 0, float("inf"), ())
    means, scores = [], []
    for k in range(1, len(hist) + 1):
        m = sum(hist[-k:]) / k
        means.append(m)
        scores.append(m + cfg.lambda_e / k)
    k_star = min(range(len(scores)), key=lambda i: (scores[i], i)) + 1
    mean = means[k_star - 1]
    return TriggerResult(mean <= cfg.theta_entropy, tuple(hist), k_star, mean, tuple(scores))


def ema_update(score: float, reward: float, alpha: float) -> float:
    """S <- (1 - α) S + α R. Worked example: S = 0.5, α = 0.3, R = 6/8 -> 0.575."""
    return (1.0 - alpha) * score + alpha * reward


def draft_length(l_max: int, score: float) -> int:
    """max(1, round(L_max · S)), halves rounded UP (pinned: 16 · 0.5625 = 9 -> 9; 4 · 0.625 = 2.5 -> 3)."""
    return max(1, int(l_max * score + 0.5))


# ---------------------------------------------------------------------------- the drafter
class ReSpecDrafter:
    def __init__(self, eagle: Eagle2Drafter | None, config: EngineConfig, *, variant: Variant = Variant(),
                 stop_token_ids: frozenset[int] = frozenset(), name: str = "respec",
                 answers: AnswerMemory | None = None) -> None:
        if variant.fallback and eagle is None:
            raise ValueError("a ReSpec variant with the model fallback needs an EAGLE-2 drafter")
        self.name = name
        self.eagle = eagle if variant.fallback else None
        self.needs_hidden = self.eagle is not None     # target features only feed the EAGLE catch-up
        self.feature_layers = eagle.feature_layers if self.eagle is not None else None   # the Drafter protocol's
        self.trigger_cfg: TriggerConfig = config.trigger
        self.cand_cfg: CandidateConfig = config.candidates
        self.sam_threshold = config.sam.len_threshold
        self.variant = variant
        self.trigger = variant.trigger
        self.selection = variant.selection
        self.stop = frozenset(stop_token_ids)
        self.answers = answers                   # earlier answers (candidates.memory_tokens > 0)
        self._init_state()

    def _init_state(self) -> None:
        self.memory: MemoryIndex | None = None    # this request's view of the earlier answers
        self.sam = SuffixAutomaton()
        self.index = NgramPositionIndex(qmax=8)
        self.scores: dict[int, float] = {}       # S_e, keyed by end position e in hist
        self.pred_of: dict[int, int] = {}        # e' -> e: e' continues e's copied span
        self._last_match: int | None = None      # match length of the last retrieval step (continuation)
        self.continuation = ContinuationEstimator()

    def reset(self, prompt: Sequence[int], prompt_hidden: torch.Tensor | None) -> None:
        self._init_state()
        self.sam.extend(prompt)
        self.index.extend(prompt)
        if self.cand_cfg.memory_tokens and self.answers is not None and len(self.answers):
            self.memory = MemoryIndex(self.answers.corpus(self.cand_cfg.memory_tokens))
        if self.eagle is not None:
            self.eagle.reset(prompt, prompt_hidden)

    # -- 1. WHEN -------------------------------------------------------------------------------
    def _when(self, ctx: DraftContext, match: int) -> tuple[bool, Decision]:
        if self.trigger == "match":
            fired = match >= self.sam_threshold
            return fired, Decision(source="", match_len=match, fired=fired,
                                   reason=f"match {match} {'≥' if fired else '<'} {self.sam_threshold}")
        t = entropy_trigger(ctx.entropies, self.trigger_cfg)
        if self.trigger == "off":        # ablation: no gate; what the gate would have done is kept
            would = "would fire" if t.fired else "would not fire"
            return True, Decision(source="", match_len=match, fired=True,
                                  reason=f"no entropy gate (ablation; H̄{t.k_star}={t.mean_entropy:.2f} {would} "
                                         f"at θ_H={self.trigger_cfg.theta_entropy:g})",
                                  extra={"gate": "off", "gate_would_fire": t.fired,
                                         "gate_mean_entropy": t.mean_entropy, "trigger_scores": list(t.scores)})
        rel = "≤" if t.fired else ">"
        reason = f"H̄{t.k_star}={t.mean_entropy:.2f} {rel} θ_H={self.trigger_cfg.theta_entropy:g}"
        return t.fired, Decision(source="", match_len=match, fired=t.fired, window=t.window, k_star=t.k_star,
                                 mean_entropy=t.mean_entropy, reason=reason,
                                 extra={"trigger_scores": list(t.scores)})

    # -- 2. WHAT -------------------------------------------------------------------------------
    def _candidates(self, ctx: DraftContext, match: int) -> list[Candidate]:
        """Every earlier match position as a Candidate: the chosen ones first (with their drafts, cut
        after a stop token), then the others in the order found; a chosen one with nothing to copy
        is dropped."""
        c = self.cand_cfg
        hist = ctx.tokens
        if self.selection == "earliest":     # legacy ablation: SAM's earliest occurrence only, no score
            cont = self.sam.earliest_continuation(ctx.root, c.l_max)
            if not cont.tokens:
                return []
            return [Candidate(end_pos=cont.end, match_len=cont.match_length, inherited_from=None,
                              score_before=None, qualified=True, draft=tuple(cut_at_stop(cont.tokens, self.stop)))]
        tail = list(hist[-QUERY_TAIL:]) + [ctx.root]
        found = [(mp.end, mp.match_length, "context") for mp in
                 self.index.positions(tail, min_match=c.min_match, max_n=c.max_positions, max_examined=c.max_positions)]
        if self.memory is not None:          # earlier answers: keyed -(1 + position), so never a context key
            found += [(-1 - mp.end, mp.match_length, "memory") for mp in
                      self.memory.positions(tail, min_match=c.min_match, max_n=c.max_positions)]
        if self.selection == "recency":      # ablation: no feedback, every score stays S0, no filter
            out = [Candidate(end_pos=e, match_len=m, inherited_from=None, score_before=c.s0, qualified=True,
                             origin=origin) for e, m, origin in found]
            chosen = sorted(out, key=lambda x: (x.match_len, x.end_pos), reverse=True)[:c.top_k]
        else:
            out = []
            for e, m, origin in found:
                inherited = None
                if e not in self.scores:
                    pred = self.pred_of.get(e)
                    inherited = pred if pred is not None and pred in self.scores else None
                    self.scores[e] = self.scores[pred] if inherited is not None else c.s0
                s = self.scores[e]
                out.append(Candidate(end_pos=e, match_len=m, inherited_from=inherited,
                                     score_before=s, qualified=s >= c.theta_score, origin=origin))
            ranked = sorted((x for x in out if x.qualified),
                            key=lambda x: (x.score_before, x.match_len, x.end_pos), reverse=True)
            chosen = ranked[:c.top_k]
        picked = {id(x) for x in chosen}
        drafted = []
        for x in chosen:
            n = draft_length(c.l_max, x.score_before)
            copied = (hist[x.end_pos + 1:x.end_pos + 1 + n] if x.end_pos >= 0
                      else self.memory.continuation(-1 - x.end_pos, n))
            draft = cut_at_stop(copied, self.stop)
            if draft:
                drafted.append(dataclasses.replace(x, draft=tuple(draft)))
        return drafted + [x for x in out if id(x) not in picked]

    def _trie(self, ctx: DraftContext, match: int, chosen: list[Candidate], t0: float
              ) -> tuple[DraftTree, SizePlan | None, float]:
        """Merge the chosen candidates' drafts into one trie and keep its most probable nodes: each
        node's probability is the continuation rate for this match length, shared among siblings by
        their candidates' scores (respec/cost.py `trie_node_probs`), so lower-ranked candidates
        branch off wherever their first tokens are likelier than the best one's deep tokens
        (`candidates.trie_order` "rank" keeps nodes in insertion order instead: the best
        candidate's whole draft first). The cost model (tree.auto) picks how many pay, up to the
        trie budget; without it the budget is filled."""
        cap = min(self.cand_cfg.tree_budget, ctx.max_nodes)
        paths = [list(x.draft) for x in chosen]
        scores = [x.score_before if x.score_before is not None else 1.0 for x in chosen]
        full = DraftTree.trie(ctx.root, paths, budget=1 + sum(len(p) for p in paths), path_scores=scores)
        rate = self.continuation.rate(match)
        probs = trie_node_probs(full.parents, full.scores, rate)
        if self.cand_cfg.trie_order == "rank":      # insertion order: ancestor-closed by construction
            order = list(range(1, full.size))
        else:
            order = ancestor_closed_order(full.parents, probs)
        plan = None
        size = min(cap, full.size)
        if ctx.cost is not None:
            plan = ctx.cost.plan("retrieval", [probs[i] for i in order], (time.perf_counter() - t0) * 1000,
                                 max_size=cap)
            size = plan.size
        return full.subtree(order[:size - 1]), plan, rate

    def _retrieve(self, ctx: DraftContext, match: int, t0: float
                  ) -> tuple[list[Candidate], DraftTree | None, SizePlan | None, float | None]:
        """Candidates (with `proposed` set once a trie is built), the trie (None when it holds no
        draft token), its cost plan and the continuation rate it was planned with."""
        cands = self._candidates(ctx, match)
        if not any(x.draft is not None for x in cands):
            return cands, None, None, None
        tree, plan, rate = self._trie(ctx, match, [x for x in cands if x.draft is not None], t0)
        cands = [x if x.draft is None else dataclasses.replace(x, proposed=_in_trie(tree, x.draft)) for x in cands]
        return cands, (tree if tree.num_draft else None), plan, rate

    def _why(self, dec: Decision, fired: bool, match: int, cands: list[Candidate], tree: DraftTree | None,
             plan: SizePlan | None, rate: float | None) -> str:
        """The step's reason in one sentence (the trigger's, then what retrieval found)."""
        other = "EAGLE-2" if self.eagle is not None else "no draft (no model fallback)"
        fallback = " fallback" if self.eagle is not None else ""
        theta = f"θ_score={self.cand_cfg.theta_score:g}"
        if not fired:
            return f"{dec.reason} → {other} (trigger off)"
        if match < self.cand_cfg.min_match:
            return f"{dec.reason}; match {match} < L_min={self.cand_cfg.min_match} → {other}"
        chosen = [x for x in cands if x.proposed]
        n_q = sum(1 for x in cands if x.qualified)
        if tree is not None:
            best = max((x.score_before or 0.0) for x in chosen) if chosen else 0.0
            return (f"{dec.reason}; match {match} ≥ L_min; {len(cands)} positions, {n_q} with S ≥ {theta}; "
                    f"best S {best:.2f} → retrieval trie of {tree.num_draft} tokens")
        if chosen or plan is not None:
            return (f"{dec.reason}; match {match}; {len(cands)} positions, {n_q} with S ≥ {theta}, but no "
                    f"retrieved draft pays (continuation {rate:.2f}) → {other}{fallback}")
        return f"{dec.reason}; match {match}; {len(cands)} positions, none with S ≥ {theta} → {other}{fallback}"

    def propose(self, ctx: DraftContext) -> Proposal:
        t0 = time.perf_counter()
        self._last_match = None
        match = self.sam.peek(ctx.root).length
        fired, dec = self._when(ctx, match)
        cands, tree, plan, rate = [], None, None, None
        if fired and match >= self.cand_cfg.min_match:
            cands, tree, plan, rate = self._retrieve(ctx, match, t0)
        why = self._why(dec, fired, match, cands, tree, plan, rate)
        extra = {**dec.extra, "candidates_found": len(cands)}
        if tree is not None:
            self._last_match = match
            if plan is not None:
                extra["cost"] = AutoDecision(plan=plan, continuation=rate).to_dict()
            decision = dataclasses.replace(dec, source="retrieval", reason=why, extra=extra)
            return Proposal(tree=tree, source="retrieval", decision=decision, candidates=tuple(cands))
        if self.eagle is None:           # ablation: retrieval only, a plain decoding step instead
            decision = dataclasses.replace(dec, source="none", reason=why, extra=extra)
            return Proposal(tree=DraftTree.root_only(ctx.root), source="none", decision=decision,
                            candidates=tuple(cands))
        eagle = self.eagle.draft(ctx)
        source = "eagle" if eagle.tree.num_draft else "none"
        if eagle.auto is not None:
            why, extra = why + f" ({eagle.auto.reason})", {**extra, "cost": eagle.auto.to_dict()}
        decision = dataclasses.replace(dec, source=source, reason=why, extra=extra)
        return Proposal(tree=eagle.tree, source=source, decision=decision, candidates=tuple(cands))

    # -- 4. feedback ---------------------------------------------------------------------------
    def _observed(self, x: Candidate, accepted: Sequence[int]) -> Candidate:
        """`x` with its outcome: tokens of its proposed draft the target accepted, and its score
        after the EMA update (which this applies to the drafter's scores)."""
        if not x.proposed:
            return dataclasses.replace(x, outcome=CandidateOutcome(
                accepted=0, score_after=x.score_before if self.selection == "ema" else None))
        a = common_prefix_len(x.draft[:x.proposed], accepted)
        score_after = None
        if self.selection == "ema":
            e = x.end_pos
            self.scores[e] = ema_update(self.scores[e], a / x.proposed, self.cand_cfg.alpha)
            score_after = self.scores[e]
            self.pred_of[e + a + 1 if e >= 0 else e - a - 1] = e     # the span continues there
        return dataclasses.replace(x, outcome=CandidateOutcome(accepted=a, score_after=score_after))

    def observe(self, outcome: StepOutcome) -> tuple[Candidate, ...] | None:
        records = None
        if outcome.proposal.source == "retrieval" and self._last_match is not None:
            accepted = list(outcome.committed[1:])
            records = tuple(self._observed(x, accepted) for x in outcome.proposal.candidates)
            self.continuation.update(self._last_match, outcome.proposal.tree.parents, outcome.verdict.path)
        self._last_match = None
        self.sam.extend(outcome.committed)
        self.index.extend(outcome.committed)
        if self.eagle is not None:
            self.eagle.observe(outcome)
        return records


def _in_trie(tree: DraftTree, path: Sequence[int]) -> int:
    """How many leading tokens of `path` are nodes of the trie (after budget truncation)."""
    node, n = 0, 0
    children = tree.children()
    for tok in path:
        nxt = next((c for c in children[node] if tree.tokens[c] == tok), None)
        if nxt is None:
            break
        node, n = nxt, n + 1
    return n
