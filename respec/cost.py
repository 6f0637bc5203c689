"""One cost model for every drafter: how many draft nodes to verify this step, chosen to maximise
expected committed tokens per millisecond.

Contract (`TreeConfig.auto`, on by default on every device):
- A drafter hands `plan_size` the acceptance probability of each of its draft nodes in an
  *ancestor-closed order* (no node before its parent; probabilities never increase along a path),
  already calibrated by the drafter's own estimator: EAGLE's head confidence x κ, a retrieval
  continuation rate learned from match statistics (`ContinuationEstimator`), ReSpec's EMA scores.
  Expected committed tokens of the first n - 1 nodes = 1 (the bonus/recovered token) + the sum of
  their probabilities. The cost of a step of n nodes (root included) is the verify-cost curve at n
  plus this step's drafting time. The plan keeps the n with the best tokens per millisecond, a
  bigger n only when it beats every smaller one by MIN_GAIN, and reports that rate relative to a
  plain decoding step (n = 1, no drafting): below 1, drafting does not pay.
- `CostModel` holds one request's view of costs: the target's verify-cost curve (measured once at
  load at a short context) shifted by the median of the last OFFSET_WINDOW steps' residuals
  (observed verify ms minus the curve at that step's size; one-token steps and trees apart, as a
  long context shifts them differently), so a long prompt is judged at its own cost, and the
  median of the last OFFSET_WINDOW drafting times per drafting source. The engine builds one per
  request (nothing leaks between requests) and feeds it every step's verify time. Where a drafter
  drafts at every step, no one-token step is ever timed and plain steps would be priced at the
  trees' shift: `wants_plain_step` asks for one plain step after FIRST_PLAIN trees with none timed,
  and after every PLAIN_EVERY trees in a row since (the EAGLE drafter obeys it).
- `ContinuationEstimator`: for retrieval drafts (SAM chains, ReSpec tries), the probability that
  the target continues along a drafted child, per match-length bucket, learned online from every
  verified retrieval step (Beta prior, exponentially decayed counts).
`AutoDecision` is the record of one step's choice that drafters put in their decision.
Pure functions (`plan_size`, `interpolate_cost`, `trie_node_probs`, EAGLE's depth-cut bound
`layer_rate_bound`) are unit-tested against
synthetic curves and acceptances (tests/test_cost_model.py).
"""
from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

OFFSET_WINDOW = 9   # recent steps whose medians (verify-time residual, draft ms) feed the plan
FIRST_PLAIN = 4     # trees in a row, no one-token step timed yet: the next step is a plain one (CostModel.wants_plain_step)
PLAIN_EVERY = 64    # trees in a row since the last one-token step timed: likewise
MIN_GAIN = 0.02     # a bigger draft must beat the best smaller one by 2% (timing noise, overheads)


def cost_max_size(config) -> int:
    """The largest draft (root included) any drafter of `config` (an EngineConfig) may verify."""
    return max(config.tree.total_tokens, config.sam.n_predicts + 1, config.candidates.tree_budget)


def interpolate_cost(curve: Mapping[int, float], n: int) -> float:
    """Verify cost of n tree tokens from a measured curve {size: ms}, linear in between/beyond."""
    xs = sorted(curve)
    if n in curve:
        return curve[n]
    if n <= xs[0]:
        return curve[xs[0]]
    for a, b in zip(xs, xs[1:]):
        if a < n < b:
            return curve[a] + (curve[b] - curve[a]) * (n - a) / (b - a)
    a, b = xs[-2:] if len(xs) > 1 else (xs[0], xs[0])
    slope = (curve[b] - curve[a]) / (b - a) if b != a else 0.0
    return curve[b] + slope * (n - b)


@dataclass(frozen=True)
class SizePlan:
    """What the cost model predicts for one step's draft (recorded in the trace)."""
    size: int                 # nodes to verify, root included (1 = no draft)
    of: int                   # nodes the drafter offered, root included
    expected_tokens: float    # committed tokens expected from the kept nodes (bonus included)
    cost_ms: float            # verify cost at `size` + this step's drafting ms
    rate_vs_plain: float      # expected tokens per ms / a plain step's (1 token per verify(1) ms)

    @classmethod
    def at(cls, probs: Sequence[float], size: int, curve: Mapping[int, float], draft_ms: float = 0.0) -> "SizePlan":
        """The prediction for verifying the first `size - 1` of `probs` (ancestor-closed order)."""
        gain = 1.0 + sum(max(0.0, min(1.0, float(p))) for p in probs[:size - 1])
        cost = interpolate_cost(curve, size) + (draft_ms if size > 1 else 0.0)
        return cls(size=size, of=len(probs) + 1, expected_tokens=gain, cost_ms=cost,
                   rate_vs_plain=gain / cost * interpolate_cost(curve, 1))

    @property
    def pays(self) -> bool:
        return self.size > 1 and self.rate_vs_plain >= 1.0

    def to_dict(self) -> dict:
        return {"kept": self.size, "of": self.of, "expected_tokens": round(self.expected_tokens, 3),
                "cost_ms": round(self.cost_ms, 2), "rate_vs_plain": round(self.rate_vs_plain, 3)}


@dataclass(frozen=True)
class AutoDecision:
    """What the cost model decided for one step's draft, as the trace records it (a decision's
    extra["cost"]): the plan, and whichever of the drafter's own facts apply. EAGLE-2 fills
    `reason` (and κ and the context offset, or the probe's hits when the head is switched off;
    `plan` is None and `kept` 1 while it sits out); retrieval drafts fill `continuation`."""
    plan: SizePlan | None
    reason: str | None = None                 # one sentence (EAGLE-2), appended to the step's reason
    kept: int | None = None                   # overrides plan.size: 1 when the head is switched off
    probe_hits: int | None = None             # the probe's top-1 matches ...
    probe_rows: int | None = None             # ... of this many checked positions
    kappa: float | None = None                # the head's calibration at this step
    context_offset_ms: float | None = None    # the cost model's context shift at this step
    continuation: float | None = None         # retrieval continuation rate for this match length

    def to_dict(self) -> dict:
        d = {} if self.plan is None else self.plan.to_dict()
        facts = {"kept": self.kept, "probe_hits": self.probe_hits, "probe_rows": self.probe_rows,
                 "kappa": None if self.kappa is None else round(self.kappa, 3),
                 "context_offset_ms": None if self.context_offset_ms is None else round(self.context_offset_ms, 2),
                 "continuation": None if self.continuation is None else round(self.continuation, 3),
                 "reason": self.reason}
        d.update((k, v) for k, v in facts.items() if v is not None)
        return d


def plan_size(probs: Sequence[float], curve: Mapping[int, float], draft_ms: float = 0.0,
              max_size: int | None = None) -> SizePlan:
    """Choose how many of `probs` (acceptance probability per draft node, ancestor-closed order) to
    verify. Worked example: curve {1: 50, 2: 50, 4: 51}, probs [.9, .8, .7] -> 3 nodes kept, size 4,
    3.4 tokens expected for 51 ms: 3.33x a plain step's 1 token per 50 ms."""
    limit = len(probs) + 1 if max_size is None else max(1, min(max_size, len(probs) + 1))
    plain = 1.0 / interpolate_cost(curve, 1)
    best_n, best_rate, gain = 1, plain, 1.0
    for j in range(limit - 1):
        gain += max(0.0, min(1.0, float(probs[j])))
        rate = gain / interpolate_cost(curve, j + 2)
        if rate > best_rate * (1.0 + MIN_GAIN):
            best_n, best_rate = j + 2, rate
    return SizePlan.at(probs, best_n, curve, draft_ms)


def layer_rate_bound(probs: Sequence[float], frontier: Sequence[float], verify_ms: Sequence[float], spent_ms: float,
                     layer_ms: float, layers_left: int) -> float:
    """An upper bound of the tokens per ms of a step whose tree keeps nodes of the next layers: a
    verified size s >= 2 holding n >= l new nodes from l >= 1 of the next `layers_left` layers
    holds s - 1 - n of the nodes so far (`probs`: calibrated, descending) and costs verify(s)
    (`verify_ms[s]`, for s up to the largest tree) plus its drafting: `spent_ms` so far plus l
    layers of `layer_ms`. A node never outweighs its parent, and a parent's children share its
    mass, so k nodes of one new layer descend from at most k frontier nodes and are worth at most
    T(k), the sum of the k largest `frontier` probabilities (calibrated); n nodes over l layers
    at most l·T(n/l) (T concave, interpolated). A chain whose first token is unsure and the rest
    near-certain (a word's sub-tokens) adds T(1) per layer: one layer's look-ahead would undervalue
    it. (Until commit 6e56d99 of 2026-12-06 every new layer was valued at the whole frontier's mass, as if a few
    slots could verify it all: on a compiled CPU forward, where a layer costs a fifth of a step,
    trees grew 2-4 layers to keep one node.)"""
    import numpy as np

    top = np.concatenate([[0.0], np.cumsum(np.clip(np.asarray(probs, dtype=np.float64), 0.0, 1.0))])   # [k + 1]
    front = np.sort(np.clip(np.asarray(frontier, dtype=np.float64), 0.0, 1.0))[::-1]
    t_front = np.concatenate([[0.0], np.cumsum(front)])                                              # [F + 1]: T(k)
    verify = np.asarray(verify_ms, dtype=np.float64)                                                   # [S + 1]
    best = 0.0
    for layers in range(1, max(1, layers_left) + 1):
        sizes = np.arange(layers + 1, len(verify))          # sizes holding at least `layers` new nodes
        if sizes.size == 0 or front.size == 0:
            break
        new = np.arange(layers, len(verify) - 1)            # new nodes n (rows) for each size (columns)
        old = np.minimum(sizes[None, :] - 1 - new[:, None], len(probs))                            # [n, s]
        new_mass = layers * np.interp(new / layers, np.arange(t_front.size), t_front)               # [n]
        gain = np.where(old >= 0, 1.0 + top[np.maximum(old, 0)] + new_mass[:, None], 0.0)          # [n, s]
        best = max(best, float((gain / (verify[sizes] + spent_ms + layers * layer_ms)[None, :]).max()))
    return best


def ancestor_closed_order(parents: Sequence[int], probs: Sequence[float]) -> list[int]:
    """Draft node indices (1..n-1) by decreasing probability, ties by index; with probabilities
    that never increase along a path and parents before children, every prefix is a subtree."""
    return sorted(range(1, len(parents)), key=lambda i: (-probs[i], i))


def trie_node_probs(parents: Sequence[int], weights: Sequence[float], rate: float) -> list[float]:
    """Acceptance probability of every node of a retrieval trie (root first, probability 1).
    The target continues past a node into one of its drafted children with probability `rate`
    (the continuation estimate); that mass is shared among the children in proportion to
    `weights` (each child's best candidate score). A chain thus gets rate, rate², ...; siblings
    are alternatives whose probabilities add up to their parent's times `rate`."""
    n = len(parents)
    probs = [1.0] + [0.0] * (n - 1)
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        children[parents[i]].append(i)
    for node in range(n):               # parents come before children
        kids = children[node]
        if not kids:
            continue
        total = sum(max(1e-9, weights[k]) for k in kids)
        for k in kids:
            probs[k] = probs[node] * rate * max(1e-9, weights[k]) / total
    return probs


@dataclass
class ContinuationEstimator:
    """P(the target continues along a drafted child | the path so far was accepted), per
    match-length bucket, from verified retrieval steps. Each node on the accepted path that had
    drafted children is one trial; it succeeds when the path went on into one of them."""
    prior: float = 0.6
    prior_weight: float = 4.0
    decay: float = 0.98
    buckets: tuple[int, ...] = (4, 8, 16)       # match lengths < 4, 4-7, 8-15, >= 16
    _succ: dict[int, float] = field(default_factory=dict)
    _trials: dict[int, float] = field(default_factory=dict)

    def bucket(self, match_len: int) -> int:
        return sum(1 for b in self.buckets if match_len >= b)

    def rate(self, match_len: int) -> float:
        b = self.bucket(match_len)
        return ((self._succ.get(b, 0.0) + self.prior * self.prior_weight)
                / (self._trials.get(b, 0.0) + self.prior_weight))

    def update(self, match_len: int, parents: Sequence[int], accepted_path: Sequence[int]) -> None:
        """accepted_path: node indices from the root (0) along the accepted draft."""
        has_kids = set(parents[1:])
        b = self.bucket(match_len)
        succ = trials = 0
        for i, node in enumerate(accepted_path):
            if node not in has_kids:
                break
            trials += 1
            if i + 1 < len(accepted_path):
                succ += 1
        self._succ[b] = self.decay * self._succ.get(b, 0.0) + succ
        self._trials[b] = self.decay * self._trials.get(b, 0.0) + trials


class CostModel:
    """One request's costs: the verify-cost curve shifted to this request's context, and recent
    drafting times per source. `curve_fn(max_size)` returns the target's load-time curve {n: ms}."""

    def __init__(self, curve_fn: Callable[[int], Mapping[int, float]], max_size: int) -> None:
        self._curve_fn = curve_fn
        self.max_size = max(1, int(max_size))
        # residuals of one-token steps and of trees (n > 1), kept apart: see `context_offset_ms`
        self._residuals = {kind: collections.deque(maxlen=OFFSET_WINDOW) for kind in ("one", "tree")}
        self._draft_ms: dict[str, collections.deque[float]] = {}
        self._trees_in_a_row = 0           # trees observed since the last one-token step

    @property
    def measured(self) -> dict[int, float]:
        return dict(self._curve_fn(self.max_size))

    def offset_ms(self, kind: str) -> float:
        """The context shift of one-token steps ("one") or of trees ("tree"): the median of that
        kind's recent residuals, the other kind's before it has any (0 before any step), floored
        so every cost stays positive. The two are kept apart because a long context does not
        shift them alike: on the compiled default model over a ~1,500-token summarization
        prompt, one-token steps ran ~3 ms above the curve and few-node trees ~9 ms, and one
        shared median (mostly trees while the head drafted) priced plain steps at the trees'
        shift, so drafts that lost to plain steps looked as if they paid (commit 8a382c3 of 2026-12-03)."""
        window = self._residuals[kind] or self._residuals["tree" if kind == "one" else "one"]
        if not window:
            return 0.0
        return max(float(statistics.median(window)), -0.5 * min(self.measured.values()))

    @property
    def context_offset_ms(self) -> float:
        """The trees' context shift (`offset_ms("tree")`), as decisions record it."""
        return self.offset_ms("tree")

    def curve(self) -> dict[int, float]:
        """This request's verify cost per tree size: one token shifted by the one-token offset,
        larger trees by the trees'."""
        one, tree = self.offset_ms("one"), self.offset_ms("tree")
        return {n: c + (one if n == 1 else tree) for n, c in self.measured.items()}

    def draft_ms(self, source: str, now: float | None = None) -> float:
        """Median of the recent drafting times of `source`, `now` included (one slow draft, e.g.
        another process on the cores, must not make drafting look dear)."""
        window = self._draft_ms.setdefault(source, collections.deque(maxlen=OFFSET_WINDOW))
        if now is not None:
            window.append(float(now))
        return float(statistics.median(window)) if window else 0.0

    def plan(self, source: str, probs: Sequence[float], draft_ms: float | None = None,
             max_size: int | None = None) -> SizePlan:
        """`plan_size` at this request's costs; `draft_ms` is this step's drafting time so far."""
        cap = self.max_size if max_size is None else min(max_size, self.max_size)
        return plan_size(probs, self.curve(), self.draft_ms(source, draft_ms), max_size=cap)

    def plain_ms(self) -> float:
        return interpolate_cost(self.curve(), 1)

    def observe(self, size: int, verify_ms: float) -> None:
        """A verified step of `size` nodes took `verify_ms` (forward + verification)."""
        kind = "one" if size <= 1 else "tree"
        self._residuals[kind].append(float(verify_ms) - interpolate_cost(self.measured, size))
        self._trees_in_a_row = 0 if kind == "one" else self._trees_in_a_row + 1

    def wants_plain_step(self) -> bool:
        """Whether the next step should verify no draft, so that a one-token step is timed at this
        request's context: after FIRST_PLAIN trees in a row with no one-token step timed yet, or
        PLAIN_EVERY since the last. Without it a head that drafts at every step has plain steps
        priced at the trees' shift, dearer over a long prompt than they are: on the compiled
        float32 default model (summarization, 2-core AMD EPYC Zen 4, commit 2d499a9 of 2026-12-06) EAGLE-2's plans
        predicted 98.9 tokens in 1,825 ms, which paid against plain steps so priced, and ran at
        0.93x vanilla, whose one-token steps took ~17.4 ms."""
        return self._trees_in_a_row >= (PLAIN_EVERY if self._residuals["one"] else FIRST_PLAIN)
