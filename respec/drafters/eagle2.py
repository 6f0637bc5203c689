"""EAGLE-2 model drafter: the dynamic tree search and the drafter that keeps the head's KV cache in
sync with the committed text (catch-up). The head itself (module, checkpoints) is
respec/drafters/heads/eagle.py.

Contract (ALGORITHMS.md §4):
- Inputs are shifted by one: the head sees pairs (f_t, x_{t+1}), f_t the target's final-norm feature
  at committed position t. The pair (f_t, x_{t+1}) sits at head position t.
- `expand_tree(step_fn, ...)` (respec/drafters/eagle_search.py) is the pure EAGLE-2 search (top-k
  expansion by cumulative log-prob to depth D, global re-rank to total_tokens), testable with a
  fake `step_fn`; an optional `expand` rule may stop it before any layer (the cost model's depth
  cut, `Eagle2Drafter._expand_rule`).
- Several GPUs: the target's features arrive on its final norm's device and are moved to the
  head's in `catch_up` (and `step_fn`).
- Auto budget (`TreeConfig.auto`): the tree is cut to the size that maximises expected tokens per
  millisecond by the one cost model every drafter uses (respec/cost.py), with node probabilities
  = the head's cumulative confidence x its calibration κ; the tree grows another layer only if
  the frontier's calibrated mass could pay for the layer's measured time; a head that does not pay
  is switched off and probed cheaply (an upper bound of its hits over a few hundred output rows
  first; see `Eagle2Drafter`). The tree search returns an `EagleDraft`: the tree and
  the cost model's `AutoDecision` for it (None without a cost model); SAM and ReSpec call
  `Eagle2Drafter.draft(ctx)` for their fallback and read nothing else of it.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from respec.config import TreeConfig
from respec.cost import (MIN_GAIN, AutoDecision, CostModel, SizePlan, ancestor_closed_order, interpolate_cost,
                         layer_rate_bound, plan_size)
from respec.drafters.base import Decision, DraftContext, Proposal, StepOutcome

# the search (respec/drafters/eagle_search.py); its names stay importable from here
from respec.drafters.eagle_search import ExpandRule, StepFn, expand_tree  # noqa: F401

from respec.drafters.heads.eagle import EagleHead
from respec.drafters.probe import bound_hits, check_vocab
from respec.models.attention import additive_mask
from respec.models.base import TargetModel
from respec.models.kv import slab_cache
from respec.transfer import read, upload
from respec.tree import DraftTree

if TYPE_CHECKING:
    from respec.memory import HeadBackoff


def capped_tree_config(cfg: TreeConfig, max_nodes: int) -> TreeConfig:
    """`cfg` with total_tokens lowered to `max_nodes` (context room), if needed."""
    if cfg.total_tokens <= max_nodes:
        return cfg
    return dataclasses.replace(cfg, total_tokens=max(1, max_nodes))


def calibrated(scores: Sequence[float], kappa: float) -> list[float]:
    """Acceptance probability of nodes with cumulative log-probs `scores`: exp(score) times the
    head's calibration κ, capped at 1 (a monotone map, so children stay <= parents)."""
    return [min(1.0, kappa * math.exp(s)) for s in scores]


def eagle_node_probs(tree: DraftTree, kappa: float) -> list[float]:
    """Acceptance probability of each node of an EAGLE tree (root first, 1): `calibrated` scores."""
    if not tree.scores:
        return [1.0] + [0.0] * (tree.size - 1)
    return [1.0] + calibrated(tree.scores[1:], kappa)


# ---------------------------------------------------------------------------- the drafter
PROBE_ROWS = 16    # catch-up rows whose head predictions are checked against the committed text
MAX_SKIP = 64      # longest stretch of steps the head sits out before the next probe
SCRATCH_WINDOW = 64  # a probe over a queue of over SCRATCH_QUEUE rows checks the head on this many last
SCRATCH_QUEUE = 1024  # positions first (shorter feeds, keys-only, cost about what that check does: commit 63792de of 2026-12-05)
EARN_DECAY = 0.97   # per drafting step: the head's earnings are judged over its last ~30 drafts
FAR_SHORT = 0.75   # a draft below this rate vs plain steps backs the head off twice as fast
DEPTH_SOURCE = "eagle layer"   # the cost model's record of one tree layer's drafting time (wall, ask to ask)
ROOT_SOURCE = "eagle root"     # ... and of a draft's start: a step's catch-up and the root's logits
# a feed's unread rows go keys-only from this many (default model, float32, 2-core AMD EPYC, eager head:
# 24 rows 3.9 ms full, 4.1 split; 80: 7.3 -> 4.8; 1,500: 130 -> 22; a compiled head's full feed over an
# empty cache costs more: a 44-row first probe 13.6 ms against 6.0 for a 78-row one fed keys-only first)
KV_ONLY_ROWS = 8


@dataclass(frozen=True)
class EagleDraft:
    """One EAGLE-2 draft: the tree (root only when the head sat out or drafted nothing) and the cost
    model's decision about it (None without a cost model, or when no draft was wanted)."""
    tree: DraftTree
    auto: AutoDecision | None = None


class Eagle2Drafter:
    """EAGLE-2 drafter with catch-up: hidden states of every committed position are queued and fed to
    the head (with the token that follows each) the next time it drafts, so its KV cache stays in
    sync even after steps it did not draft (retrieval steps in SAM/ReSpec).

    With a cost model (`tree.auto`), each tree is cut to the size that pays (respec/cost.py), node
    probabilities being the head's cumulative confidence times its calibration κ (realised/predicted
    accepted tokens, decayed). After two unprofitable drafts in a row (each judged at its own
    drafting ms, not the median its plan charges), a head whose drafting steps
    have on balance run slower than plain steps (`earns_keep`: committed tokens over drafting +
    verify ms, decayed by EARN_DECAY per draft) sits out 2^misses steps (at most MAX_SKIP; a draft
    below FAR_SHORT of a plain step's rate counts as two misses), queueing features at no cost;
    then a cheap probe (the catch-up alone, its predictions checked against the committed tokens:
    an upper bound over a few hundred output rows first, respec/drafters/probe.py) decides whether
    even a one-token draft (charged a draft's start, never the probe's catch-up) would pay. Every
    request starts with a probe (a random head never drafts; a new kind of prompt is judged at
    once); a head the runner's last request left off (`backoff`, respec/memory.py) goes on from its
    misses; refused on the prompt's rows (a head trained on answers matches 0.16 of them, 0.36 of
    answers: commit 63792de of 2026-12-05) with some matches, it waits PROBE_ROWS steps, no miss, to judge the
    answer's. A draft is not charged the feeding of a queue longer than one step commits (paid once
    whatever is drafted; commit d9c4d47 of 2026-12-04: 22.9 ms of a 12 ms step); over a queue of more than
    SCRATCH_QUEUE rows the probe first runs the head on the last SCRATCH_WINDOW positions in a
    throwaway cache: a head matching none stays off with the queue unfed, any other is fed the
    whole queue and judged in full context.
    A feed's rows whose predictions nobody reads (all but the probe's and the last, KV_ONLY_ROWS
    or more) only get their keys and values written (`EagleHead.feed_context`)."""

    name = "eagle2"
    needs_hidden = True
    clock: Callable[[], float] = staticmethod(time.perf_counter)   # seconds; tests inject a fake one

    def __init__(self, target: TargetModel, head: EagleHead, tree: TreeConfig,
                 backoff: "HeadBackoff | None" = None) -> None:
        self.target = target
        self.head = head
        self.backoff = backoff          # the runner's record of a switched-off head's misses (or None)
        self.feature_layers = head.feature_layers      # which target features the head reads (EAGLE-3)
        self.tree_cfg = tree
        self.cache = slab_cache(head.config)
        self._pending: list[torch.Tensor] = []   # each [m_i, H]: features of committed positions
        target.prepare_head(head)      # compiled with a compiled target, else its own eager linear plan
        self._reset_auto()

    def _reset_auto(self) -> None:
        # calibration sums (decayed), miss streak, back-off and probe state for useless drafting
        self._pred_sum = self._real_sum = 0.0
        self._misses = 0
        self._skip = 0
        self._probing = True
        self._first_probe = True                  # the request's first probe (judged on its prompt) is to come
        self._last_pred: float | None = None
        self._drafted_ms: float | None = None     # this step's drafting time, when the head grew a tree
        self._earned_tokens = self._earned_ms = 0.0   # its drafting steps' committed tokens and ms, decayed
        self._hits = self._rows = 0               # the last catch-up's top-1 check (a bound until exact)
        self._cut: tuple[float, float] | None = None   # the last tree's depth cut (bound, layer ms)
        self._check: tuple[torch.Tensor, list[int]] | None = None   # its rows [r, H] and tokens

    @property
    def kappa(self) -> float:
        """Calibration: realised accepted tokens / predicted (Σ exp score), decayed, prior 1."""
        return (self._real_sum + 1.0) / (self._pred_sum + 1.0)

    @property
    def kv_len(self) -> int:
        return self.cache.get_seq_length()

    def reset(self, prompt: Sequence[int], prompt_hidden: torch.Tensor | None) -> None:
        self.cache = slab_cache(self.head.config)
        self._pending = [] if prompt_hidden is None else [prompt_hidden]
        self._reset_auto()
        if self.backoff is not None:       # a head the last request left switched off: its misses go on
            self._misses = self.backoff.misses if self.backoff.off else 0

    def observe(self, outcome: StepOutcome) -> None:
        if self.backoff is not None:
            self.backoff.misses, self.backoff.off = self._misses, self._probing
        if outcome.committed_hidden is not None:
            self._pending.append(outcome.committed_hidden)
        if self._last_pred is not None and outcome.proposal.source == "eagle":
            self._pred_sum = 0.9 * self._pred_sum + self._last_pred
            self._real_sum = 0.9 * self._real_sum + outcome.verdict.num_accepted
        if self._drafted_ms is not None:           # the head grew a tree this step (kept or not)
            self._earned_tokens = EARN_DECAY * self._earned_tokens + len(outcome.committed)
            self._earned_ms = EARN_DECAY * self._earned_ms + self._drafted_ms + outcome.verify_ms
        self._last_pred = self._drafted_ms = None

    def _pending_pairs(self, committed: Sequence[int], root: int) -> tuple[torch.Tensor, list[int], int]:
        """The queued features [m, H] (on the head's device), the token that follows each (the
        last one is `root`), and the head position of the first. Leaves the queue as it is."""
        # Features come from the target's final norm, which under device_map="auto" can sit on
        # another GPU than the head (placed with the embedding): move them to the head.
        head_dev = self.head.fc.weight.device
        feats = torch.cat([p.to(head_dev) for p in self._pending], dim=0)          # [m, H] on the head's device
        start = self.kv_len
        m = feats.shape[0]
        nxt = list(committed[start + 1:start + m]) + [root]
        if len(nxt) != m:
            raise RuntimeError(f"EAGLE catch-up out of sync: {m} features, {len(nxt)} tokens")
        return feats, nxt, start

    def _feed(self, feats: torch.Tensor, nxt: Sequence[int], start: int, cache, check: bool,
              context: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the head over pairs (feats [m, H], nxt [m]) at head positions start.. into `cache`.
        Returns f̂ [H] and log-probs [V] at the last position. With `check`, keeps the last
        PROBE_ROWS positions' predicted features and the tokens that followed them for the probe,
        and sets `self._hits` of `self._rows` to an upper bound of their top-1 matches computed over
        a few hundred output rows (respec/drafters/probe.py, `context` supplying candidates); the
        exact count follows only if the bound says the head might pay (`_exact_hits`). Rows before
        those are fed keys-only when there are KV_ONLY_ROWS of them or more."""
        m = feats.shape[0]
        dev = self.target.device
        emb = self.target.embed(upload(list(nxt), dev, label="catch-up"))         # [m, H]
        pos = torch.arange(start, start + m, device=dev)
        r = min(m - 1, PROBE_ROWS) if check else 0
        ctx = m - r - 1 if m - r - 1 >= KV_ONLY_ROWS else 0     # rows whose predictions nobody reads
        if ctx:
            self.head.feed_context(emb[:ctx], feats[:ctx], pos[:ctx], cache)
        out = self.head(emb[ctx:], feats[ctx:], pos[ctx:], cache, None)           # [m - ctx, H]
        self._check = None
        self._hits = self._rows = 0
        if r > 0:
            truth = [int(t) for t in nxt[m - r:]]
            rows = out[-1 - r:-1]                                                    # [r, H]
            self._check = (rows, truth)
            ids = check_vocab(self.target.vocab_size, truth, context, self.head.draft_vocab)
            logits = self.head.logits_over(self.target, rows, ids) if ids.numel() else rows.new_zeros(r, 0)
            self._hits, self._rows = bound_hits(logits, truth, ids), r
        logits = self.head.draft_logits(self.target, out[-1:]).float()              # [1, V]
        return out[-1], torch.log_softmax(logits[-1], dim=-1)                      # [H], [V]

    def _exact_hits(self) -> None:
        """Replace the probe's bound by the exact count: the rows' top-1 over the whole (draft)
        vocabulary against the tokens that followed."""
        if self._check is None:
            return
        rows, truth = self._check
        self._check = None
        top = self.head.draft_logits(self.target, rows).float().argmax(dim=-1)       # [r]
        if self.head.draft_vocab is not None:
            top = self.head.draft_vocab.to(top.device)[top]
        self._hits = sum(int(a == b) for a, b in zip(read(top, label="probe")[0], truth))

    @torch.inference_mode()
    def catch_up(self, committed: Sequence[int], root: int, check: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed pending pairs (f_t, x_{t+1}), the last one pairing with `root`, into the head's
        cache. Returns the head's prediction at the root position: f̂ [H] and log-probs [V]. With
        `check`, also counts how many of the last PROBE_ROWS fed positions the head's top-1
        predicts the committed token that followed (`self._hits` of `self._rows`): its depth-1
        acceptance, teacher-forced."""
        feats, nxt, start = self._pending_pairs(committed, root)
        self._pending = []
        return self._feed(feats, nxt, start, self.cache, check, context=committed)

    @torch.inference_mode()
    def scratch_check(self, committed: Sequence[int], root: int) -> None:
        """The probe's check without the catch-up: the head runs over the last SCRATCH_WINDOW
        queued pairs only, in a throwaway cache (so it sees at most that much context), and sets
        `self._hits` of `self._rows`. The queue stays, so a head that stays off never pays for
        feeding it a long prompt."""
        feats, nxt, start = self._pending_pairs(committed, root)
        w = min(SCRATCH_WINDOW, feats.shape[0])
        m = feats.shape[0]
        self._feed(feats[m - w:], nxt[m - w:], start + m - w, slab_cache(self.head.config), check=True,
                   context=committed)

    def draft(self, ctx: DraftContext) -> EagleDraft:
        """The step's EAGLE-2 draft after ctx.root, within the step's node cap (what `propose`, and
        SAM and ReSpec for their fallback, call)."""
        return self.draft_tree(ctx.tokens, ctx.root, capped_tree_config(self.tree_cfg, ctx.max_nodes), ctx.cost)

    @torch.inference_mode()
    def draft_tree(self, committed: Sequence[int], root: int, cfg: TreeConfig | None = None,
                   cost: CostModel | None = None) -> EagleDraft:
        """The EAGLE-2 tree after `root`; with `cost` (tree.auto), cut to the size that pays and
        possibly root-only (the head switched off), with the cost model's decision."""
        cfg = cfg or self.tree_cfg
        if cfg.total_tokens <= 1:
            # No draft wanted: leave the pending pairs queued; a later draft catches up in one batch.
            return EagleDraft(DraftTree.root_only(root))
        if cost is not None and self._skip > 0:
            self._skip -= 1
            return EagleDraft(DraftTree.root_only(root), AutoDecision(
                plan=None, kept=1, reason=f"auto: the head did not pay recently; next probe in {self._skip + 1} steps"))
        if cost is not None and cost.wants_plain_step():     # the queue waits for the next draft, as above
            return EagleDraft(DraftTree.root_only(root), AutoDecision(
                plan=None, kept=1, reason="auto: a plain step, to time one at this context (CostModel.wants_plain_step)"))
        t0 = self.clock()
        if not self._pending and self.kv_len == 0:
            raise RuntimeError("EAGLE drafter used before reset")
        probing = cost is not None and self._probing
        fed_from = self.kv_len
        if probing and sum(p.shape[0] for p in self._pending) > SCRATCH_QUEUE:
            # a long queue (a prompt, or many steps with the head off): judge the head on its tail
            # first, and feed the whole queue only if it is worth drafting with
            self.scratch_check(committed, root)
            if self._hits == 0:              # matched nothing even there: off, the queue unfed
                return EagleDraft(DraftTree.root_only(root), self._probe_refusal(cost))
            # some hits: judge it with its full context (a short window must not turn a good head off)
            f, logp = self.catch_up(committed, root, check=True)
        else:
            f, logp = self.catch_up(committed, root, check=probing)
        if probing:
            refusal = self._probe_refusal(cost)
            if refusal is not None:
                return EagleDraft(DraftTree.root_only(root), refusal)
        self._probing = self._first_probe = False
        # a queue longer than one step commits (the prompt, a sit-out) is fed once whatever is
        # drafted: the plan, and the depth cut's time spent, count the tree's growth and one head row in its place
        t_tree, row_ms = t0, 0.0
        if cost is not None and self.kv_len - fed_from > cfg.depth + 1:
            t_tree, row_ms = self.clock(), self._root_ms(cost)
        stable = self.kv_len
        step_fn, expand = self._step_fn(stable), None
        self._cut = None
        if cost is not None and cfg.depth_cut:
            expand = self._expand_rule(cost, cfg, t_tree, row_ms)
        try:
            tree = expand_tree(step_fn, root, f, logp, cfg, vocab=self.head.draft_vocab, expand=expand)
        finally:
            added = self.kv_len - stable
            if added > 0:
                self.cache.crop(-added)      # the draft tree's KV is scratch: keep the context only
        if cost is None:
            return EagleDraft(tree)
        return self._plan(tree, cost, (self.clock() - t_tree) * 1000 + row_ms)

    def _expand_rule(self, cost: CostModel, cfg: TreeConfig, t0: float, spent_before: float = 0.0) -> ExpandRule:
        """The cost model's depth cut: grow another layer only if it could raise the step's
        expected tokens per millisecond. The next layer's nodes are children of the frontier, so
        their calibrated probabilities add up to at most κ·Σ exp(frontier score) (every later
        layer's to no more; k of them to no more than the k likeliest frontier nodes). A layer costs
        the request's median layer time, timed on the wall from one question to the next, so the
        search's own top-k, read-back and bookkeeping count (before any layer is timed, the head's
        row time, `EagleHead.row_ms`; until commit 6e56d99 of 2026-12-06 the head's call alone was timed: 3.4 ms of
        a compiled CPU layer's ~5). Each question also times what came before it: the first, after a
        step's short feed, a draft's start (catch-up and root logits: `ROOT_SOURCE`, what a one-token
        draft costs), every later one the layer just grown. The rate to beat is the
        best the nodes so far reach (their plan, with the drafting time spent so far: from `t0`, plus
        `spent_before`; after a long queue's feed, the tree's growth and one head row, as its plan
        is charged, since that feed is paid whatever is grown). A layer is
        grown only if both (1) that bound per layer-millisecond beats it, and (2) some verified
        size holding nodes of the layers still to grow could beat the step's rate if it stopped
        now, with every size's verify cost and the drafting counted on both sides
        (`layer_rate_bound`). Both over-estimate what the layers could add, so a layer is cut only
        if it could not raise the step's rate. (2) matters where two tokens cost much more than one
        (1.43x, bf16 without dot-product instructions, commit df7f4d2 of 2026-12-03): a tree that keeps no node yet
        stops before its second layer."""
        curve, kappa = cost.curve(), self.kappa
        verify_ms = [interpolate_cost(curve, n) for n in range(max(2, cfg.total_tokens) + 1)]   # [size] -> ms
        asked, last = 0, t0                       # layers asked about so far (one per call), when last asked

        def expand(scores: Sequence[float], frontier: Sequence[float]) -> bool:
            nonlocal asked, last
            asked += 1
            now_t = self.clock()                  # after the search read the rounds back: their work is done
            if asked > 1 or spent_before == 0.0:  # a layer (ask to ask), or a draft's start after a step's short feed
                cost.draft_ms(DEPTH_SOURCE if asked > 1 else ROOT_SOURCE, (now_t - last) * 1000)
            last = now_t
            # no layer timed yet in this request: the head's row time stands in (as for a probe)
            layer_ms = self._layer_ms(cost)
            if layer_ms <= 0.0:
                return True
            probs = sorted(calibrated(scores, kappa), reverse=True)
            spent = (now_t - t0) * 1000 + spent_before
            now = plan_size(probs, curve, spent, max_size=cfg.total_tokens)
            bound = kappa * sum(math.exp(sc) for sc in frontier)
            rate_now = now.expected_tokens / now.cost_ms
            # (2): the drafting so far is spent whatever is grown, so it is charged on both sides
            stop_now = now.expected_tokens / (verify_ms[now.size] + spent)
            grow = (bound / layer_ms > rate_now and
                    layer_rate_bound(probs, calibrated(frontier, kappa), verify_ms, spent, layer_ms,
                                     cfg.depth - asked + 1) > stop_now)
            if not grow:
                self._cut = (bound, layer_ms)
            return grow

        return expand

    def _step_fn(self, stable: int) -> StepFn:
        """The search's step over the head's cache of `stable` context rows (see StepFn)."""
        dev = self.target.device
        dtype = self.target.dtype
        # Tree-mask rows of the batch fed last, over every draft slot fed so far: a node sees its
        # parent's row plus itself (EAGLE's tmask[parent_slots] ++ I).
        # Built on the device (no [kq, kv] host mask copied each depth).
        head_dev = self.head.fc.weight.device
        last_rows = torch.zeros(0, 0, dtype=torch.bool, device=head_dev)

        def step_fn(feats: torch.Tensor, tokens: torch.Tensor, depth: int, parent_slots: torch.Tensor | None):
            nonlocal last_rows
            kq = tokens.shape[0]
            n_fed = last_rows.shape[1]
            prev = (torch.zeros(kq, n_fed, dtype=torch.bool, device=head_dev) if parent_slots is None
                    else last_rows[parent_slots.to(head_dev)])
            last_rows = torch.cat([prev, torch.eye(kq, dtype=torch.bool, device=head_dev)], dim=1)  # [kq, n_fed + kq]
            mask = additive_mask(~last_rows, stable, dtype)                                       # [1, 1, kq, kv]
            pos = torch.full((kq,), stable + depth, dtype=torch.long, device=dev)
            out = self.head(self.target.embed(tokens.to(dev)), feats.to(head_dev), pos, self.cache, mask)  # [kq, H]
            return out, torch.log_softmax(self.head.draft_logits(self.target, out).float(), dim=-1)  # [kq, V]

        return step_fn

    def _probe_refusal(self, cost: CostModel) -> AutoDecision | None:
        """After a catch-up with `check`: would a one-token draft at the head's observed top-1 rate
        (hits / (rows + 2): cautious, so a handful of rows cannot switch a head on by luck) beat a
        plain step, at what such a draft costs (`_one_token_plan`)? None if so; otherwise the
        head sits out longer and the decision says why. The catch-up's count is an upper bound
        (a few hundred vocabulary rows); only when the bound says the head might pay are the rows
        checked against the whole vocabulary, so a useless head is refused without ever paying
        for the output layer."""
        plan = self._one_token_plan(cost)
        bound = self._check is not None
        if plan.rate_vs_plain >= 1.0 + MIN_GAIN and bound:
            self._exact_hits()
            plan, bound = self._one_token_plan(cost), False
        if plan.rate_vs_plain >= 1.0 + MIN_GAIN:
            return None
        self._check = None
        # a head that matched nothing over many rows is plainly useless: back off twice as fast
        useless = self._hits == 0 and self._rows >= PROBE_ROWS // 2
        wait = self._first_probe and not useless     # judged on the prompt: wait for the answer's rows, no miss
        self._misses += 0 if wait else 2 if useless else 1
        self._skip = PROBE_ROWS if wait else min(MAX_SKIP, 2 ** self._misses)
        self._first_probe = False
        matched = f"at most {self._hits}" if bound else f"{self._hits}"
        return AutoDecision(plan=plan, kept=1, probe_hits=self._hits, probe_rows=self._rows,
                            reason=f"auto probe: the head's top-1 matched {matched} of the last "
                                   f"{self._rows} tokens; a 1-token draft would run at "
                                   f"{plan.rate_vs_plain:.2f}x a plain step → head off for {self._skip} steps")

    def _one_token_plan(self, cost: CostModel) -> SizePlan:
        """A one-token draft at the probe's top-1 rate (without drafting cost when even a free
        draft would not pay), charged what a draft's start costs (`_root_ms`: a step's catch-up and
        the root's logits; the median tree layer, dearer, until commit 6e56d99 of 2026-12-06). Not the probe's own
        catch-up: feeding a long queue (the prompt, a long sit-out) is paid once, whatever the
        decision; later drafts feed a step's few positions."""
        acc, curve = self._hits / (self._rows + 2.0), cost.curve()
        free = SizePlan.at([acc], 2, curve)
        if free.rate_vs_plain < 1.0 + MIN_GAIN:
            return free              # would not pay even if drafting were free: nothing to time
        return SizePlan.at([acc], 2, curve, self._root_ms(cost))

    def _root_ms(self, cost: CostModel) -> float:
        """A one-token draft's ms: the request's median draft start (a step's catch-up and the
        root's logits, up to the depth cut's first question), else `EagleHead.row_ms`."""
        return cost.draft_ms(ROOT_SOURCE) or self.head.row_ms(self.target)

    def _layer_ms(self, cost: CostModel) -> float:
        """One tree layer's drafting ms: the request's median layer time, else `EagleHead.row_ms`."""
        return cost.draft_ms(DEPTH_SOURCE) or self.head.row_ms(self.target)

    def earns_keep(self, cost: CostModel) -> bool:
        """Whether the head's drafting steps have committed tokens faster than plain steps would
        have (decayed sums over every step it grew a tree, unprofitable ones included); False
        before it has drafted. A good head's run of unprofitable drafts then costs only those
        drafts (cut early by the depth rule) instead of a sit-out that also skips the confident
        steps after it; a head whose drafting does not pay on balance still backs off."""
        if self._earned_ms <= 0.0:
            return False
        return self._earned_tokens / self._earned_ms >= 1.0 / cost.plain_ms()

    def _plan(self, tree: DraftTree, cost: CostModel, draft_ms: float) -> EagleDraft:
        probs = eagle_node_probs(tree, self.kappa)
        order = ancestor_closed_order(tree.parents, probs)
        plan = cost.plan("eagle", [probs[i] for i in order], draft_ms)
        pruned = tree.subtree(order[:plan.size - 1])
        self._drafted_ms = draft_ms
        # what the drafting bought, at this step's own drafting ms (sunk, so known exactly; the plan
        # charges the request's median, and on a compiled CPU forward a depth-3 tree took ~8 ms
        # against a ~5.5 ms median: commit 538c1f4 of 2026-12-06): the expected tokens over the verify cost + that. A
        # tree cut to nothing ran a plain step plus its drafting (until commit 538c1f4 of 2026-12-06 its plan's 1.00x
        # reset the misses, and a compiled head kept nothing for 13 steps in a row at 2.7 ms each).
        curve = cost.curve()
        paid = plan.expected_tokens * interpolate_cost(curve, 1) / (interpolate_cost(curve, plan.size) + draft_ms)
        if paid < 1.0:
            # a draft that ran at under FAR_SHORT of a plain step's rate counts as two misses
            self._misses += 2 if paid < FAR_SHORT else 1
            if self._misses >= 2 and not self.earns_keep(cost):
                self._skip = min(MAX_SKIP, 2 ** self._misses)
                self._probing = True
        else:
            self._misses = 0
        self._last_pred = sum(probs[i] for i in order[:plan.size - 1])
        cut = ""
        if self._cut is not None:
            bound, layer_ms = self._cut
            cut = (f"; grown to depth {max(tree.depths())} only: another layer would add at most "
                   f"{bound:.2f} tokens for {layer_ms:.1f} ms")
        return EagleDraft(pruned, AutoDecision(
            plan=plan, kappa=self.kappa, context_offset_ms=cost.context_offset_ms,
            reason=f"auto: kept {plan.size - 1} of {tree.size - 1} nodes, expected "
                   f"{plan.expected_tokens:.2f} tokens/step at {plan.rate_vs_plain:.2f}x "
                   f"a plain step (κ={self.kappa:.2f}){cut}"))

    def propose(self, ctx: DraftContext) -> Proposal:
        draft = self.draft(ctx)
        source = "eagle" if draft.tree.num_draft else "none"
        decision = None
        if draft.auto is not None:
            decision = Decision(source=source, reason=draft.auto.reason, extra={"cost": draft.auto.to_dict()})
        return Proposal(tree=draft.tree, source=source, decision=decision)
