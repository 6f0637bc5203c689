"""A compiled EAGLE head (`--compile on`): the head's layer and draft output layer through `torch.compile`.

Contract:
- `CompiledHead.of(head, target)` compiles `head`'s eager forward (`EagleHead.eager_forward`: the
  fc, one decoder layer, RoPE, the causal mask when none is given) and its draft output layer
  (`EagleHead.draft_output_layer`, built once) with inductor and dynamic shapes, so a graph compiles once
  for any row count, context length and cache capacity (dynamo gives one-row calls, and calls
  with and without a mask, graphs of their own). An EAGLE-1/2 and an EAGLE-3
  head compile alike: what compiles is the head's own forward.
- `CompiledHead.forward` serves calls over a cache that already holds rows; a call over an empty
  cache (the head's first catch-up of a prompt, the probe's scratch window) stays eager, as the
  target's prefills do, so lazy buffer creation never enters a graph. The cache's slabs are grown
  before each call (`reserve`), so no growth happens inside a graph either.
- Both run `Trusted` (respec/models/compiled.py): after the warm-up, only the guards that tell
  the graphs apart are evaluated.
- `warm_up()` pays the compiles: one-row and tree batches, with and without a mask, before and
  after the cache's first growth, and the draft output layer at one and several rows, in a
  throwaway cache, with a progress line; then times the head's row (`EagleHead.row_ms`, which the
  cost model reads at a request's first probe), so no request pays a compile or that timing.
  `HFTarget.enable_compile` compiles the target; an `Eagle2Drafter` on a compiled target
  compiles its head on construction (once per head and target).
- Why: on the CPU an eager head call is mostly dispatch. On the default model one head layer plus
  its 8,192-row draft output layer moves ~18 MB (~0.5 ms at the machine's bandwidth) but took
  ~1.2 ms eager; next to a compiled target step (~15 ms), eager drafting weighed 1.5x what it does
  next to an eager step. Compiled and eager heads may round differently in bf16; drafts only
  propose, verification decides, so output stays lossless either way.
Nothing is compiled at import.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from respec.models.compiled import Trusted, compile_base_settings
from respec.models.kv import reserve, slab_cache


@dataclass
class CompiledHead:
    """The compiled forward and draft output layer of one head for one target (see the module
    docstring); `warmed` says whether `warm_up` ran."""
    head: torch.nn.Module
    target: object
    forward_fn: Trusted
    logits_fn: Trusted
    warmed: bool = False

    @classmethod
    def of(cls, head, target) -> "CompiledHead":
        compile_base_settings(head.fc.weight.device)
        layer = head.draft_output_layer(target)      # built eagerly, held by the graph (no head state read)

        def logits(out: torch.Tensor) -> torch.Tensor:
            return layer(out)

        # dynamic shapes; dynamo still specialises a one-row call into its own graph
        forward_fn = Trusted(torch.compile(head.eager_forward, backend="inductor", dynamic=True))
        logits_fn = Trusted(torch.compile(logits, backend="inductor", dynamic=True))
        return cls(head, target, forward_fn, logits_fn)

    def forward(self, emb: torch.Tensor, feat: torch.Tensor, positions: torch.Tensor, cache,
                mask: torch.Tensor | None) -> torch.Tensor:
        """EagleHead.forward's contract: emb, feat [q, *], positions [q], mask or None -> [q, H]."""
        if cache.get_seq_length() == 0:
            return self.head.eager_forward(emb, feat, positions, cache, mask)
        reserve(cache, int(emb.shape[0]))
        # contiguous inputs: a graph guards on strides, and the search passes expanded features
        return self.forward_fn(emb.contiguous(), feat.contiguous(), positions.contiguous(), cache,
                               None if mask is None else mask.contiguous())

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """out [q, H] -> logits [q, V or Vd] (EagleHead.draft_logits' contract)."""
        return self.logits_fn(out.contiguous())

    @torch.inference_mode()
    def warm_up(self, progress: bool = True, pause=None) -> float:
        """Run the calls that trigger the compiles (see the module docstring); returns seconds.
        `pause`, when given, is called before each shape (respec/models/compiled.py warm_up)."""
        from tqdm.auto import tqdm

        from respec.models.attention import additive_mask
        from respec.models.kv import INITIAL_CAPACITY

        t0 = time.perf_counter()
        self.forward_fn.trusted = self.logits_fn.trusted = False      # every guard while warming up
        head, target = self.head, self.target
        dev, dtype = head.fc.weight.device, head.fc.weight.dtype
        feat_width = head.fc.in_features // (1 if head.feature_layers is not None else 2)
        cache = slab_cache(head.config)

        def call(emb: torch.Tensor, feat: torch.Tensor, masked: bool) -> torch.Tensor:
            q, kv = emb.shape[0], cache.get_seq_length()
            mask = additive_mask(~torch.eye(q, dtype=torch.bool, device=dev), kv, dtype) if masked else None
            return self.forward(emb, feat, torch.arange(kv, kv + q, device=dev), cache, mask)   # [q, H]

        def feed(q: int, masked: bool) -> None:
            emb = target.embed(torch.arange(q, device=dev) % 100)                           # [q, H]
            out = call(emb, torch.zeros(q, feat_width, dtype=dtype, device=dev), masked)   # feat [q, F]
            self.draft_logits(out)
            if head.feature_layers is not None:         # EAGLE-3 depths >= 2 feed the head's own output
                call(emb, out, masked)

        # (rows, tree mask?) per call; the long feed grows the slab past its first capacity
        plan = [(24, False), (1, False), (3, False), (2, False), (1, True), (4, True), (3, True), (8, True),
                (INITIAL_CAPACITY, False), (1, False), (3, False), (1, True), (4, True)]
        for q, masked in tqdm(plan, desc="compiling the EAGLE head (once per process)", disable=not progress,
                              unit="shape"):
            if pause is not None:
                pause()
            feed(q, masked)
        self.warmed = self.forward_fn.trusted = self.logits_fn.trusted = True
        head.row_ms(target)          # timed now, on the compiled head: a first request does not pay it
        return time.perf_counter() - t0
