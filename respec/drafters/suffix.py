"""SuffixDecoding (arXiv 2411.04975) as a peer method, `suffix`, drafting through its own library:
arctic-inference's `SuffixDecodingCache` (the retrieval drafter of vLLM's `method="suffix"`).

Contract:
- `suffix_library()` -> (SuffixDecodingCache class, None) or (None, the reason in one line): the
  import is tried once. `make_drafter("suffix", ...)` raises ConfigError with that line where the
  package is missing or unbuilt; every other method runs as before.
- `SuffixMemory` owns the library's cache: one per runner (respec/memory.py), so with
  `suffix.global_cache` the responses of earlier requests (a bench's or Lab run's earlier
  questions, the app's earlier runs) are a second source; a request is started at `reset` (prompt
  as a 1-D contiguous int32 array), each step's committed tokens are appended, and it is stopped
  when the next one starts (its response stays in the global tree).
- `SuffixDrafter` asks `speculate` for at most min(suffix.max_depth, the step's room) tokens with
  the request's last 64 tokens and the root as context; the library's tree (token ids, parent
  indices with -1 for the root, estimated probabilities) becomes a DraftTree of "retrieval" nodes,
  cut after any stop token, and, with a cost model, to the nodes that pay (the library's
  probabilities as acceptance estimates). Verification is the engine's, strict: lossless.
- No EAGLE head and no target features (`needs_hidden` False); nothing matched = a plain step.
"""
from __future__ import annotations

import itertools
import time
from typing import Any, Sequence

from respec.config import SuffixConfig
from respec.cost import AutoDecision, ancestor_closed_order
from respec.drafters.base import Decision, DraftContext, Proposal, StepOutcome
from respec.errors import ConfigError
from respec.tree import DraftTree

CONTEXT = 64           # the library's suffix trees are 64 deep: longer contexts are cut there
_LIBRARY: list[Any] = []


def suffix_library() -> tuple[Any, str | None]:
    """(SuffixDecodingCache, None), or (None, why the package cannot be used)."""
    if not _LIBRARY:
        try:
            from arctic_inference.suffix_decoding import SuffixDecodingCache
            _LIBRARY.append((SuffixDecodingCache, None))
        except Exception as exc:  # noqa: BLE001 - missing, or its C++ extension not built
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            _LIBRARY.append((None, f"the suffix method needs arctic-inference's SuffixDecodingCache, which cannot "
                                   f"be imported here ({reason}); scripts/setup.sh builds it"))
    return _LIBRARY[0]


class SuffixMemory:
    """The library's cache across requests: a global tree of responses (kept when a request's
    config says `global_cache`), and the request being decoded."""

    def __init__(self) -> None:
        self._caches: dict[bool, Any] = {}
        self._ids = itertools.count()
        self._active: tuple[Any, int] | None = None

    def begin(self, prompt: Sequence[int], global_cache: bool) -> tuple[Any, int]:
        """Stop the previous request (its response stays cached) and start one for `prompt`."""
        import numpy as np
        cls, reason = suffix_library()
        if cls is None:
            raise ConfigError(reason)
        self.end()
        cache = self._caches.get(global_cache)
        if cache is None:
            cache = self._caches[global_cache] = cls(max_tree_depth=CONTEXT, max_cached_requests=-1 if global_cache else 0)
        req = next(self._ids)
        cache.start_request(req, np.ascontiguousarray(prompt, dtype=np.int32))
        self._active = (cache, req)
        return self._active

    def end(self) -> None:
        if self._active is not None:
            cache, req = self._active
            if req in cache.active_requests:
                cache.stop_request(req)
            self._active = None

    def cached_responses(self, global_cache: bool = True) -> int:
        """How many earlier responses the global tree holds (0 without one)."""
        cache = self._caches.get(global_cache)
        return 0 if cache is None or not global_cache else len(cache.cached_requests)


class SuffixDrafter:
    name = "suffix"
    needs_hidden = False
    feature_layers = None

    def __init__(self, cfg: SuffixConfig, memory: SuffixMemory, stop_token_ids: frozenset[int] = frozenset()) -> None:
        if suffix_library()[0] is None:
            raise ConfigError(suffix_library()[1])
        self.cfg = cfg
        self.memory = memory
        self.stop = frozenset(stop_token_ids)
        self._req: tuple[Any, int] | None = None

    def reset(self, prompt: Sequence[int], prompt_hidden=None) -> None:
        self._req = self.memory.begin(prompt, self.cfg.global_cache)

    def propose(self, ctx: DraftContext) -> Proposal:
        import numpy as np
        t0 = time.perf_counter()
        cache, req = self._req
        n = min(self.cfg.max_depth, ctx.max_nodes - 1)
        context = np.ascontiguousarray([*ctx.tokens[-(CONTEXT - 1):], ctx.root], dtype=np.int32)
        draft = cache.speculate(req, context, max_spec_tokens=n, max_spec_factor=self.cfg.spec_factor,
                                max_spec_offset=self.cfg.spec_offset, min_token_prob=self.cfg.min_prob,
                                use_tree_spec=self.cfg.tree) if n > 0 else None
        tree, probs = library_tree(ctx.root, draft, self.stop, n)
        plan = None
        if ctx.cost is not None and tree.num_draft:
            order = ancestor_closed_order(tree.parents, probs)
            plan = ctx.cost.plan("retrieval", [probs[i] for i in order], (time.perf_counter() - t0) * 1000)
            tree = tree.subtree(order[:plan.size - 1])
        if not tree.num_draft:
            reason = ("no suffix match" if draft is None or not draft.token_ids
                      else f"match {draft.match_len}: no drafted length pays")
            return Proposal(tree=DraftTree.root_only(ctx.root), source="none",
                            decision=Decision(source="none", reason=f"suffix tree: {reason} → plain step",
                                              match_len=int(getattr(draft, "match_len", 0) or 0),
                                              extra={"cost": AutoDecision(plan=plan).to_dict()} if plan else {}))
        extra: dict[str, Any] = {"suffix": {"score": round(float(draft.score), 3), "match_len": int(draft.match_len),
                                            "offered": len(draft.token_ids)}}
        if plan is not None:
            extra["cost"] = AutoDecision(plan=plan).to_dict()
        decision = Decision(source="retrieval", match_len=int(draft.match_len), extra=extra,
                            reason=f"suffix tree: match {draft.match_len} → {tree.num_draft} of "
                                   f"{len(draft.token_ids)} token(s) (score {draft.score:.2f})")
        return Proposal(tree=tree, source="retrieval", decision=decision)

    def observe(self, outcome: StepOutcome) -> None:
        import numpy as np
        cache, req = self._req
        cache.add_active_response(req, np.ascontiguousarray(list(outcome.committed), dtype=np.int32))


def library_tree(root: int, draft, stop: frozenset[int], cap: int) -> tuple[DraftTree, list[float]]:
    """The library's draft (token_ids, parents: -1 = the root, probs) as a DraftTree of retrieval
    nodes with per-node probabilities (root 1.0): nodes after a stop token, nodes whose parent was
    dropped, and nodes beyond `cap` are left out."""
    tokens, parents, probs, keep = [root], [-1], [1.0], {-1: 0}
    if draft is not None:
        for i, (tok, par) in enumerate(zip(draft.token_ids, draft.parents)):
            if len(tokens) - 1 >= cap:
                break
            if par not in keep or (par >= 0 and tokens[keep[par]] in stop):
                continue
            keep[i] = len(tokens)
            tokens.append(int(tok))
            parents.append(keep[par])
            p = float(draft.probs[i]) if i < len(draft.probs) else 0.0
            probs.append(min(p, probs[keep[par]]))        # a path's probability never grows
    return DraftTree(tuple(tokens), tuple(parents), ("root",) + ("retrieval",) * (len(tokens) - 1)), probs
