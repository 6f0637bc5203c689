"""The EAGLE-2 tree search (ALGORITHMS.md §4.3), pure and on the device: `expand_tree(step_fn, ...)`
grows the dynamic tree by top-k expansion on cumulative log-prob to depth D, then re-ranks globally
to total_tokens. It is testable with a fake `step_fn`; an optional `expand` rule may stop it before
any layer (the cost model's depth cut, respec/drafters/eagle2.py `Eagle2Drafter._expand_rule`).

Contract: frontier tokens, scores and parent rows stay on the device between layers; the host
reads the layers back through respec/transfer.py once before each `expand` question and once at
the end (one read each, whatever the tree's width), and builds the DraftTree from them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from respec.config import TreeConfig
from respec.transfer import read
from respec.tree import DraftTree

# ---------------------------------------------------------------------------- the search
#: step_fn(feats [k, H], tokens [k], depth i, parent_slots [k] | None) -> (out feats [k, H],
#:     log-probs of each node's children [k, V]). parent_slots[a] is the row, in the previous
#:     call's batch, of frontier node a's parent (None at depth 0: every parent is the root).
StepFn = Callable[[torch.Tensor, torch.Tensor, int, "torch.Tensor | None"], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class _Node:
    token: int
    score: float     # cumulative log q from the root
    parent: int      # index into the node list, -1 = child of the root


#: expand(scores of every node so far, scores of the frontier) -> whether to grow one more layer.
ExpandRule = Callable[[Sequence[float], Sequence[float]], bool]


@dataclass(frozen=True)
class _Layer:
    """One expansion round of the search, on the device: the k' x k scored candidates (row a: the
    children of frontier node a) and which of them (flat, ascending) form the next frontier."""
    tokens: torch.Tensor      # [k' * k] token ids of the candidates
    scores: torch.Tensor      # [k' * k] float64 cumulative log q
    chosen: torch.Tensor      # [k''] flat indices of the next frontier, ascending


def _grow_nodes(nodes: list[_Node], frontier: list[int], k: int, tokens: Sequence[int], scores: Sequence[float],
                chosen: Sequence[int]) -> list[int]:
    """Append one read-back round's candidates to `nodes` (row a: children of frontier[a]) and
    return the next frontier's node indices."""
    first = len(nodes)
    for a, parent in enumerate(frontier):
        for b in range(k):
            nodes.append(_Node(int(tokens[a * k + b]), float(scores[a * k + b]), parent))
    return [first + c for c in chosen]


def expand_tree(step_fn: StepFn, root: int, root_feat: torch.Tensor, root_logp: torch.Tensor,
                cfg: TreeConfig, vocab: torch.Tensor | None = None, expand: ExpandRule | None = None
                ) -> DraftTree:
    """EAGLE-2 dynamic tree. root_feat: [H] f̂ predicted at the root's position; root_logp: [V] the
    head's log-probs for the token after the root. Returns a tree of at most cfg.total_tokens nodes.
    With `vocab` [V] (a reduced draft vocabulary), log-prob index i stands for token vocab[i].

    1. Layer 1 = top-k of root_logp (score = log q).
    2. Up to `depth` times: feed the k frontier nodes (features = their parents' outputs), score
       their top-k children by cumulative log-prob, keep the best k of the k² as the next frontier.
       With `expand`, each round first asks it (cumulative log-probs of every node so far and of
       the frontier); False stops the search there (the cost model's depth cut).
    3. Global re-rank: keep the best total_tokens - 1 of all scored nodes. Scores never increase
       along a path and ties break by creation order, so the kept set is ancestor-closed.
    The search stays on the device (frontier tokens, scores and parent rows never leave it); the
    host reads the rounds back once before each `expand` question and once at the end.
    """
    budget = cfg.total_tokens - 1
    if budget <= 0:
        return DraftTree.root_only(root)
    k = min(cfg.top_k, budget, root_logp.shape[-1])
    ids = (lambda ix: ix) if vocab is None else (lambda ix: vocab.to(ix.device)[ix])
    top = torch.topk(root_logp.float(), k)
    front_tok, front_score = ids(top.indices), top.values.double()            # [k], [k] on the device
    unread = [_Layer(front_tok, front_score, torch.arange(k, device=front_tok.device))]
    nodes: list[_Node] = []
    frontier: list[int] = [-1]                    # the root's "row": every layer-1 node's parent
    feats = root_feat[None].expand(k, -1)                                     # [k, H]
    parent_slots = None
    for i in range(cfg.depth):
        if expand is not None:
            frontier = _read_rounds(unread, nodes, frontier)
            if not expand([nd.score for nd in nodes], [nodes[j].score for j in frontier]):
                break
        out, logp = step_fn(feats, front_tok, i, parent_slots)               # [k', H], [k', V]
        ct = torch.topk(logp.float(), k, dim=-1)                              # [k', k]
        # the parents' scores enter in float32, as they always have (identical trees)
        cu = (ct.values.double() + front_score.float().double()[:, None]).flatten()   # [k' * k]
        chosen = torch.topk(cu, min(k, cu.numel())).indices.sort().values    # [k'']
        layer = _Layer(ids(ct.indices).flatten(), cu, chosen)
        unread.append(layer)
        front_tok, front_score = layer.tokens[chosen], cu[chosen]
        parent_slots = chosen // k                                            # [k'']: row of each parent
        feats = out[parent_slots.to(out.device)]
    _read_rounds(unread, nodes, frontier)
    order = sorted(range(len(nodes)), key=lambda j: (-nodes[j].score, j))[:budget]
    keep = sorted(order)
    index = {j: r + 1 for r, j in enumerate(keep)}
    tokens = [root] + [nodes[j].token for j in keep]
    parents = [-1] + [0 if nodes[j].parent == -1 else index[nodes[j].parent] for j in keep]
    scores = [0.0] + [nodes[j].score for j in keep]
    probs = [1.0] + [math.exp(nodes[j].score - (0.0 if nodes[j].parent == -1 else nodes[nodes[j].parent].score))
                     for j in keep]
    return DraftTree.from_parents(tokens, parents, "eagle", scores=scores, draft_probs=probs)


def _read_rounds(unread: list[_Layer], nodes: list[_Node], frontier: list[int]) -> list[int]:
    """Read every round not yet read back in ONE device-to-host read, append its nodes, and return
    the frontier's node indices after the last of them (`unread` is emptied)."""
    if not unread:
        return frontier
    got = read(*[t for layer in unread for t in (layer.tokens, layer.scores, layer.chosen)], label="draft")
    for r in range(len(unread)):
        tokens, scores, chosen = got[3 * r:3 * r + 3]
        frontier = _grow_nodes(nodes, frontier, len(tokens) // len(frontier), tokens, scores, chosen)
    unread.clear()
    return frontier
