"""Draft trees: one type for chains, retrieval tries and EAGLE-2 trees.

Contract: a `DraftTree` holds the draft continuations rooted at the newest target-chosen token (the
*root*: chosen by the target, not yet fed to it). Node 0 is the root; `parents[i] < i` for every
i > 0, so ancestors precede descendants and any prefix of the node list is a valid tree. A chain of k
draft tokens has parents [-1, 0, 1, ..., k-1]; a root-only tree is plain autoregressive decoding.

Everything derived from the tree (depths = position offsets, the ancestor attention mask, the
root-to-leaf paths) is computed by pure functions here, so it can be tested on hand-drawn trees.

Node sources: "root" (the target's own token), "retrieval" (copied from earlier text by a
suffix-automaton / position-index drafter), "eagle" (proposed by the EAGLE-2 head).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

SOURCES = ("root", "retrieval", "eagle")


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...]                  # [n + 1]; tokens[0] is the root
    parents: tuple[int, ...]                 # [n + 1]; parents[0] == -1, parents[i] < i
    sources: tuple[str, ...]                 # [n + 1]; "root" | "retrieval" | "eagle"
    scores: tuple[float, ...] | None = None  # [n + 1]; cumulative log q (eagle) or EMA score (retrieval)
    draft_probs: tuple[float, ...] | None = None  # [n + 1]; q(token | ancestors) if the drafter knows it
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if n == 0:
            raise ValueError("a draft tree needs at least its root")
        if len(self.parents) != n or len(self.sources) != n:
            raise ValueError(f"tokens, parents and sources must have one entry per node ({n}), "
                             f"got {len(self.parents)} parents and {len(self.sources)} sources")
        if self.parents[0] != -1:
            raise ValueError("node 0 is the root and must have parent -1")
        for i in range(1, n):
            if not 0 <= self.parents[i] < i:
                raise ValueError(f"node {i} has parent {self.parents[i]}; parents must precede children")
        for s in self.sources:
            if s not in SOURCES:
                raise ValueError(f"unknown node source {s!r}")
        for name in ("scores", "draft_probs"):
            v = getattr(self, name)
            if v is not None and len(v) != n:
                raise ValueError(f"{name} must have one entry per node ({n}), got {len(v)}")

    # ---------------------------------------------------------------- constructors
    @classmethod
    def root_only(cls, root: int) -> DraftTree:
        return cls(tokens=(int(root),), parents=(-1,), sources=("root",))

    @classmethod
    def chain(cls, root: int, tokens: Sequence[int], source: str,
              scores: Sequence[float] | None = None) -> DraftTree:
        n = len(tokens)
        return cls(tokens=(int(root), *map(int, tokens)), parents=tuple(range(-1, n)),
                   sources=("root",) + (source,) * n,
                   scores=None if scores is None else (0.0, *map(float, scores)))

    @classmethod
    def from_parents(cls, tokens: Sequence[int], parents: Sequence[int], sources: Sequence[str] | str,
                     scores: Sequence[float] | None = None,
                     draft_probs: Sequence[float] | None = None) -> DraftTree:
        """`sources` may be one string for every non-root node."""
        if isinstance(sources, str):
            sources = ("root",) + (sources,) * (len(tokens) - 1)
        return cls(tokens=tuple(map(int, tokens)), parents=tuple(map(int, parents)),
                   sources=tuple(sources),
                   scores=None if scores is None else tuple(map(float, scores)),
                   draft_probs=None if draft_probs is None else tuple(map(float, draft_probs)))

    @classmethod
    def trie(cls, root: int, paths: Sequence[Sequence[int]], budget: int, source: str = "retrieval",
             path_scores: Sequence[float] | None = None) -> DraftTree:
        """Merge token sequences (each continuing after the root) into a prefix trie of at most
        `budget` nodes, root included. Paths are inserted in the given order (callers pass them best
        first), so when the budget runs out the best paths are the ones kept. A node's score is the
        best score of the paths through it."""
        tokens, parents, scores = [int(root)], [-1], [0.0]
        children: list[dict[int, int]] = [{}]
        for p, path in enumerate(paths):
            s = 0.0 if path_scores is None else float(path_scores[p])
            node = 0
            for tok in path:
                nxt = children[node].get(int(tok))
                if nxt is None:
                    if len(tokens) >= budget:
                        break
                    nxt = len(tokens)
                    tokens.append(int(tok)); parents.append(node); scores.append(s)
                    children[node][int(tok)] = nxt
                    children.append({})
                else:
                    scores[nxt] = max(scores[nxt], s)
                node = nxt
        return cls.from_parents(tokens, parents, source, scores=scores)

    def subtree(self, nodes: Sequence[int]) -> "DraftTree":
        """The root plus draft `nodes` (indices into this tree; must be ancestor-closed), in their
        original order, with scores and draft probabilities carried over."""
        keep = [0] + sorted(set(int(i) for i in nodes) - {0})
        if len(keep) == self.size:
            return self
        index = {old: new for new, old in enumerate(keep)}
        try:
            parents = [-1] + [index[self.parents[i]] for i in keep[1:]]
        except KeyError:
            raise ValueError("subtree: the kept nodes are not ancestor-closed") from None
        return DraftTree.from_parents([self.tokens[i] for i in keep], parents,
                                      [self.sources[i] for i in keep],
                                      scores=None if self.scores is None else [self.scores[i] for i in keep],
                                      draft_probs=None if self.draft_probs is None
                                      else [self.draft_probs[i] for i in keep])

    # ---------------------------------------------------------------- derived views
    @property
    def size(self) -> int:
        """Number of nodes including the root."""
        return len(self.tokens)

    @property
    def num_draft(self) -> int:
        """Number of draft tokens (nodes other than the root)."""
        return len(self.tokens) - 1

    def depths(self) -> tuple[int, ...]:
        """[n + 1]; depth of each node (root 0) == its position offset after the committed text."""
        if "depths" not in self._cache:
            d = [0] * self.size
            for i in range(1, self.size):
                d[i] = d[self.parents[i]] + 1
            self._cache["depths"] = tuple(d)
        return self._cache["depths"]

    def children(self) -> tuple[tuple[int, ...], ...]:
        """[n + 1]; children of each node, in node order."""
        if "children" not in self._cache:
            ch: list[list[int]] = [[] for _ in range(self.size)]
            for i in range(1, self.size):
                ch[self.parents[i]].append(i)
            self._cache["children"] = tuple(tuple(c) for c in ch)
        return self._cache["children"]

    def path_to(self, node: int) -> tuple[int, ...]:
        """Node indices from the root to `node`, both included."""
        path = []
        while node != -1:
            path.append(node)
            node = self.parents[node]
        return tuple(reversed(path))

    def leaves(self) -> tuple[int, ...]:
        return tuple(i for i, c in enumerate(self.children()) if not c)

    def attention_mask(self) -> torch.Tensor:
        """[n + 1, n + 1] bool; entry (i, j) is True iff node j is an ancestor of node i or i itself.

        Worked example, tree root->a, root->b, a->c (parents [-1, 0, 0, 1]):
            root: [1 0 0 0]; a: [1 1 0 0]; b: [1 0 1 0]; c: [1 1 0 1]
        """
        n = self.size
        mask = torch.zeros(n, n, dtype=torch.bool)
        mask[0, 0] = True
        for i in range(1, n):
            mask[i] = mask[self.parents[i]]
            mask[i, i] = True
        return mask

    def retrieve_indices(self) -> torch.Tensor:
        """[n_leaves, max_depth + 1] int64; one root-to-leaf path of node indices per row, -1 padded."""
        paths = [self.path_to(leaf) for leaf in self.leaves()]
        width = max(len(p) for p in paths)
        out = torch.full((len(paths), width), -1, dtype=torch.long)
        for r, p in enumerate(paths):
            out[r, :len(p)] = torch.tensor(p, dtype=torch.long)
        return out

    def to_dict(self) -> dict:
        d = {"tokens": list(self.tokens), "parents": list(self.parents), "sources": list(self.sources)}
        if self.scores is not None:
            d["scores"] = list(self.scores)
        if self.draft_probs is not None:
            d["draft_probs"] = list(self.draft_probs)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> DraftTree:
        return cls.from_parents(d["tokens"], d["parents"], d["sources"], scores=d.get("scores"),
                                draft_probs=d.get("draft_probs"))
