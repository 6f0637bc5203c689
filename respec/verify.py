"""Verification of a DraftTree against the target's outputs. Pure functions.

Glossary (used everywhere in this project):
- *draft token*: a non-root node of the DraftTree, proposed by a drafter (retrieval or EAGLE-2).
- *accepted token*: a draft node the target agrees with. Under strict greedy verification a node
  is accepted iff its parent was accepted (or is the root) and its token is the target's argmax
  after the parent. Under sampling it is accepted with the target's (residual) probability.
- *bonus token*: the target's own choice after the deepest accepted node (argmax, or a sample from
  p there); it becomes the root of the next step. After a sampling rejection the next root is a
  *recovered* token, drawn from the residual distribution.
- Each step commits root + accepted tokens; the next root (bonus/recovered) is committed by the next
  step. *Mean accepted length* = tokens committed per target forward = 1 + accepted per step: it
  COUNTS the bonus token (Spec-Bench's MAT; vanilla decoding scores exactly 1.0).

Letters: p = target distribution, q = drafter distribution. Draft tokens of this engine are
deterministic top-k / retrieval proposals (q is a point mass), so lossless sampling follows the
multi-draft rule of ALGORITHMS.md §4.6: siblings are tried in order, each accepted with probability
p(x) under the current residual; a rejected x gets p(x) = 0 and p is renormalised.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from respec.config import RelaxConfig
from respec.transfer import read, to_host, upload_parts
from respec.tree import DraftTree


@dataclass(frozen=True)
class Verdict:
    path: tuple[int, ...]                 # node indices, root first: root + accepted nodes
    next_token: int                       # bonus or recovered token (the next step's root)
    next_kind: Literal["bonus", "recovered"]
    node_status: tuple[str, ...]          # [n + 1] "accepted" | "relaxed" | "rejected" | "unvisited";
                                          # the root is always "accepted"
    num_relaxed: int = 0

    @property
    def num_accepted(self) -> int:
        """Accepted draft tokens (root and bonus excluded)."""
        return len(self.path) - 1

    def to_dict(self) -> dict:
        return {"path": list(self.path), "next_token": self.next_token, "next_kind": self.next_kind,
                "node_status": list(self.node_status), "num_relaxed": self.num_relaxed}

    @classmethod
    def from_dict(cls, d: dict) -> Verdict:
        return cls(path=tuple(d["path"]), next_token=int(d["next_token"]), next_kind=d["next_kind"],
                   node_status=tuple(d["node_status"]), num_relaxed=int(d.get("num_relaxed", 0)))


@dataclass(frozen=True)
class StepNumbers:
    """What the host needs of one tree forward, read back at once (`read_numbers`): per row i of
    the logits, the target's top-1 and the entropy and top-1/top-2 margin of its distribution;
    per node, how the target rates its token under the node's parent's row (row 0, the root, is
    rated against its own row and carries no meaning)."""
    top1: list[int]
    entropies: list[float]
    margins: list[float]
    ranks: list[int]                 # 1 = the target's top-1
    gaps: list[float]                # top-1 logit minus the token's logit (= the log-prob gap)
    logprobs: list[float]            # log p(token | ancestors)
    probs: list[float]               # exp(logprobs), taken on the device as the trace always had them


def read_numbers(tree: DraftTree, logits: torch.Tensor, tokens: torch.Tensor | None = None,
                 parents: torch.Tensor | None = None) -> StepNumbers:
    """logits [n, V] (row i predicts the children of node i) -> StepNumbers, in ONE device-to-host
    read: the eager path (`number_table` is the compiled one). Few passes over the logits: one
    log-softmax serves the entropies and the log-probs, one top-2 the margins and the gaps; only
    the rank reads each node's parent row. `tokens` / `parents` ([n] on logits' device, the root's
    parent 0): the tree's own, as forward_tree uploaded them (else uploaded here, once)."""
    if tokens is None or parents is None:
        tokens, parents = upload_parts([tree.tokens, [max(p, 0) for p in tree.parents]], logits.device, "stats")
    logp = torch.log_softmax(logits.float(), dim=-1)                                 # [n, V]
    top2 = torch.topk(logits, min(2, logits.shape[-1]), dim=-1).values               # [n, 2]
    zd = logits[parents, tokens]                                                     # [n]: each node's token
    ranks = (logits.index_select(0, parents) > zd[:, None]).sum(-1) + 1              # [n]
    logprobs = logp[parents, tokens]
    rows = torch.stack([-(logp.exp() * logp).nansum(-1),                # entropy; a -inf logit adds 0, not nan
                        (top2[:, 0] - top2[:, -1]).float()])                        # [2, n]
    nodes = torch.stack([(top2[:, 0][parents] - zd).float(), logprobs, logprobs.exp()])   # [3, n]
    r, n, top1, ranks = read(rows, nodes, logits.argmax(dim=-1), ranks, label="verify")
    return StepNumbers(top1=top1, entropies=r[0], margins=r[1], ranks=ranks, gaps=n[0], logprobs=n[1], probs=n[2])


NUMBER_COLUMNS = ("top1", "entropy", "margin", "rank", "gap", "logprob", "prob")


def number_table(logits: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """logits [n, V] float32, tokens [n] and parents [n] (the root's parent 0) -> [n, 7] float32: a
    tree forward's StepNumbers as one tensor, columns NUMBER_COLUMNS (per row: top-1, entropy,
    margin; per node: rank, gap, log-prob and prob of its token under its parent's row).
    The same definitions as `read_numbers` (top-1 is the first maximal index;
    a tied top-2 gives margin 0), written for a compiler: each column is a reduction over a row
    that inductor fuses with the others, so the compiled output layer returns the table with the
    logits (respec/accel/compiled.py `compile_logits`): 0.5 ms for 16 rows of the default model's
    49k vocabulary against ~2 ms for the eager ops of read_numbers, which stay the eager path
    (this form is slower eagerly). Ids travel as float32: exact below 2**24 (callers check)."""
    best, top1 = logits.max(-1)                                                   # [n], [n]
    shifted = logits - best[:, None]                                              # [n, V]
    mass = shifted.exp()
    total = mass.sum(-1)                                                          # [n]
    log_total = total.log()
    lse = best + log_total
    ent = log_total - torch.where(mass > 0, mass * shifted, 0.0).sum(-1) / total      # -inf logits: 0, not nan
    ids = torch.arange(logits.shape[-1], device=logits.device)
    second = torch.where(ids == top1[:, None], float("-inf"), logits).amax(-1) if logits.shape[-1] > 1 else best
    zd = logits[parents, tokens]                                                  # [n]
    ranks = (logits[parents] > zd[:, None]).sum(-1) + 1
    logprobs = zd - lse[parents]
    return torch.stack([top1.float(), ent, best - second, ranks.float(), best[parents] - zd, logprobs,
                        logprobs.exp()], -1)


def read_number_table(table: torch.Tensor) -> StepNumbers:
    """A `number_table` [n, 7] -> StepNumbers, in ONE device-to-host read."""
    (cols,) = read(table.t(), label="verify")
    col = dict(zip(NUMBER_COLUMNS, cols))
    return StepNumbers(top1=[int(v) for v in col["top1"]], entropies=col["entropy"], margins=col["margin"],
                       ranks=[int(v) for v in col["rank"]], gaps=col["gap"], logprobs=col["logprob"],
                       probs=col["prob"])


def verify_greedy(tree: DraftTree, logits: torch.Tensor, relax: RelaxConfig | None = None,
                  no_relax_ids: frozenset[int] = frozenset(), numbers: StepNumbers | None = None) -> Verdict:
    """Greedy verification: strict everywhere, or source-aware relaxed when `relax` is given with a
    budget > 0 and the tree has retrieval nodes (see `verify_relaxed`; `numbers`, when read
    already, spare the read-back)."""
    if relax is not None and relax.budget > 0 and "retrieval" in tree.sources:
        return verify_relaxed(tree, logits, relax, no_relax_ids, numbers)
    return verify_strict(tree, logits, None if numbers is None else numbers.top1)


def verify_strict(tree: DraftTree, logits: torch.Tensor, top1: Sequence[int] | None = None) -> Verdict:
    """Strict greedy verification. logits: [n + 1, vocab]; row i is the target's prediction after
    node i (given node i's ancestors). Walks from the root, at each node accepting the child whose
    token equals the target's argmax there; that walk is the longest accepted path (strict
    acceptance has at most one valid child per node, except duplicate siblings, where the first
    wins). The bonus token is the argmax after the last accepted node. `top1`: the argmax of
    every row, when read back already."""
    if top1 is None:
        top1 = read(logits.argmax(dim=-1), label="argmax")[0]           # [n + 1]
    children = tree.children()
    status = ["unvisited"] * tree.size
    status[0] = "accepted"
    path = [0]
    node = 0
    while True:
        nxt = None
        for c in children[node]:
            if nxt is None and tree.tokens[c] == top1[node]:
                nxt = c
                status[c] = "accepted"
            else:
                status[c] = "rejected"
        if nxt is None:
            break
        path.append(nxt)
        node = nxt
    return Verdict(path=tuple(path), next_token=int(top1[node]), next_kind="bonus",
                   node_status=tuple(status))


def verify_sampling(tree: DraftTree, probs: torch.Tensor, generator: torch.Generator) -> Verdict:
    """Lossless speculative sampling over a tree of point-mass proposals.
    probs: [n + 1, vocab] target probabilities (after temperature/top-k/top-p); row i is p after
    node i. `generator` is a CPU torch.Generator; the result is reproducible for a given seed.

    At each accepted node, children are tried in node order: child x is accepted with probability
    p(x) (p renormalised after earlier rejections); a rejected child gets p(x) = 0. If a child is
    accepted we descend; otherwise the next token is drawn from the residual p (recovered). At a node
    without children the next token is drawn from p itself (bonus)."""
    children = tree.children()
    status = ["unvisited"] * tree.size
    status[0] = "accepted"
    path = [0]
    node = 0
    while True:
        kids = children[node]
        p = to_host(probs[node].detach(), "sampling").to(torch.float64)
        p = p / p.sum()
        accepted = None
        rejected_any = False
        for c in kids:
            tok = tree.tokens[c]
            u = torch.rand((), generator=generator, dtype=torch.float64).item()  # host
            if u < p[tok].item():  # host
                accepted = c
                status[c] = "accepted"
                break
            status[c] = "rejected"
            rejected_any = True
            p[tok] = 0.0
            total = p.sum()
            if total <= 0:       # numerically nothing left: fall back to the target's argmax
                p = to_host(probs[node].detach(), "sampling").to(torch.float64)
                p = (p == p.max()).double()
                total = p.sum()
            p = p / total
        if accepted is None:
            nxt = int(torch.multinomial(p, 1, generator=generator).item())  # host
            return Verdict(path=tuple(path), next_token=nxt,
                           next_kind="recovered" if rejected_any else "bonus",
                           node_status=tuple(status))
        path.append(accepted)
        node = accepted


def node_relaxable(mode: str, source: str, token: int, wanted: int, rank: int, gap: float, relax: RelaxConfig,
                   no_relax_ids: frozenset[int] = frozenset()) -> bool:
    """May this node ever be relaxed (before the path tests of `path_tolerates`)? Only a RETRIEVAL
    node whose token and target top-1 (`wanted`) are both outside `no_relax_ids` (special and
    digit-only tokens); under mode "lookahead" its rank must also be <= β and its log-prob gap to the
    top-1 <= τ (Spec-Verification). "fly" and "shift" apply no β / τ test."""
    if source != "retrieval" or token in no_relax_ids or wanted in no_relax_ids:
        return False
    if mode == "lookahead":
        return rank <= relax.beta and gap <= relax.tau
    return True


def path_tolerates(mode: str, i: int, tokens: Sequence[int], wanted: Sequence[int], lookahead: int) -> bool:
    """The path part of the rule for a mismatch at position i of one root-to-leaf path
    (tokens[0] = the root, tokens[i] = d_i, wanted[i] = a_i, the target's top-1 at the node that
    predicts d_i; m = len(tokens) - 1):
    - every mode: the next w = `lookahead` draft tokens match exactly (i + w <= m and d_j == a_j for
      j = i+1 .. i+w), so the last w tokens of a path can never be relaxed;
    - "shift" also: i + 1 <= m and d_{i+1} == a_i (d_i is an extra token: the draft re-aligns with
      what the target wanted at i one position later)."""
    m = len(tokens) - 1
    if i + lookahead > m or any(tokens[j] != wanted[j] for j in range(i + 1, i + lookahead + 1)):
        return False
    if mode == "shift":
        return i + 1 <= m and tokens[i + 1] == wanted[i]
    return True


def walk_relaxed_path(tokens: Sequence[int], wanted: Sequence[int], relaxable: Sequence[bool],
                      relax: RelaxConfig) -> tuple[int, tuple[int, ...]]:
    """Walk one root-to-leaf path under the relaxed rule: at i = 1..m, an exact match continues; a
    mismatch continues as a relaxed acceptance iff budget is left, `relaxable[i]` (node_relaxable)
    and `path_tolerates(relax.mode, ...)`; else the walk stops. Returns (tokens accepted, the
    positions i accepted by relaxation)."""
    m = len(tokens) - 1
    left = relax.budget
    relaxed: list[int] = []
    for i in range(1, m + 1):
        if tokens[i] == wanted[i]:
            continue
        if not (left > 0 and relaxable[i] and path_tolerates(relax.mode, i, tokens, wanted, relax.lookahead)):
            return i - 1, tuple(relaxed)
        left -= 1
        relaxed.append(i)
    return m, tuple(relaxed)


def verify_relaxed(tree: DraftTree, logits: torch.Tensor, relax: RelaxConfig,
                   no_relax_ids: frozenset[int] = frozenset(), numbers: StepNumbers | None = None) -> Verdict:
    """ReSpec's source-aware relaxed verification (ALGORITHMS.md §1.6), greedy only.
    logits: [n + 1, vocab]. On each root-to-leaf path x0 -> d_1 .. d_m, with z_i the logits of the
    node that predicts d_i and a_i = argmax z_i:
      strict(i)    := d_i == a_i
      relaxable(i) := d_i is a RETRIEVAL node, neither d_i nor a_i is in `no_relax_ids` (special and
                      digit-only tokens), and, under relax.mode "lookahead", rank of d_i in z_i <= β
                      and lp(a_i) - lp(d_i) <= τ                          (node_relaxable)
      tolerated(i) := i + w <= m and strict(j) for j = i+1 .. i+w; mode "shift" also d_{i+1} == a_i
                                                                          (path_tolerates)
    Walk i = 1..m: strict -> continue; else relax (at most `budget` per path) if relaxable and
    tolerated -> continue; else stop. The path with the most accepted tokens wins; ties go to fewer
    relaxed acceptances, then to the earlier path. EAGLE nodes are only ever accepted strictly.
    With budget = 0 this is exactly `verify_strict`."""
    tokens = tree.tokens
    n = tree.size
    if numbers is None:
        numbers = read_numbers(tree, logits)
    top1_list, rank_l, gap_l = numbers.top1, numbers.ranks, numbers.gaps                 # [n + 1] each
    wanted = [top1_list[max(p, 0)] for p in tree.parents]                  # a_i of every node
    relaxable = [False] + [node_relaxable(relax.mode, tree.sources[i], tokens[i], wanted[i], rank_l[i], gap_l[i],
                                          relax, no_relax_ids) for i in range(1, n)]
    best: tuple[int, int, tuple[int, ...], tuple[int, ...]] | None = None   # (acc, -relaxed, path, relaxed)
    for leaf in tree.leaves():
        full = tree.path_to(leaf)
        acc, rel = walk_relaxed_path([tokens[v] for v in full], [wanted[v] for v in full],
                                     [relaxable[v] for v in full], relax)
        key = (acc, -len(rel))
        if best is None or key > (best[0], best[1]):
            best = (key[0], key[1], tuple(full[:acc + 1]), tuple(full[i] for i in rel))
    _, _, path, relaxed_nodes = best
    status = ["unvisited"] * n
    on_path = set(path)
    children = tree.children()
    for node in path:
        status[node] = "accepted"
        for c in children[node]:
            if c not in on_path:
                status[c] = "rejected"
    for node in relaxed_nodes:
        status[node] = "relaxed"
    return Verdict(path=path, next_token=int(top1_list[path[-1]]), next_kind="bonus",
                   node_status=tuple(status), num_relaxed=len(relaxed_nodes))
