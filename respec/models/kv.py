"""KV caches of the target and the EAGLE head: transformers' DynamicCache with its full-attention
layers stored in one growing slab per layer instead of being re-concatenated on every forward.

Contract: `slab_cache(config)` returns a `DynamicCache` whose plain `DynamicLayer`s are replaced by
`SlabLayer`s (sliding-window and other layer kinds are kept as transformers made them). A SlabLayer
holds keys/values in a preallocated [B, H_kv, capacity, D] buffer; `keys`/`values` are views of its
first `length` rows, so attention reads exactly what a DynamicLayer would return (the logits are
bit-identical, tests/test_kv_cache.py). `update` writes the new rows in place (amortised O(new rows),
where `torch.cat` copies the whole cache each forward: ~18 MB per step at a 800-token context on the
default model); `crop(-k)` only shortens the view. The buffer doubles when full.
Writes into `keys[:, :, a:b]` (HFTarget.keep's compaction) land in the buffer.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

INITIAL_CAPACITY = 512     # rows per layer before the first doubling


class SlabLayer(DynamicLayer):
    """A DynamicLayer backed by a growing buffer (see the module docstring)."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self._k = key_states.new_empty(*key_states.shape[:2], INITIAL_CAPACITY, key_states.shape[3])
        self._v = value_states.new_empty(*value_states.shape[:2], INITIAL_CAPACITY, value_states.shape[3])
        self._len = 0
        self._views()
        self.is_initialized = True

    def _views(self) -> None:
        self.keys = self._k[:, :, :self._len]                 # [B, H_kv, length, D]
        self.values = self._v[:, :, :self._len]

    def _grow(self, need: int) -> None:
        cap = self._k.shape[2]
        while cap < need:
            cap *= 2
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_empty(*old.shape[:2], cap, old.shape[3])
            new[:, :, :self._len] = old[:, :, :self._len]
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """key_states/value_states: [B, H_kv, n, D]; returns the views [B, H_kv, length + n, D]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[2]
        self.reserve(n)
        self._k[:, :, self._len:self._len + n] = key_states
        self._v[:, :, self._len:self._len + n] = value_states
        self._len += n
        self._views()
        return self.keys, self.values

    def reserve(self, rows: int) -> None:
        """Make room for `rows` more rows (the buffer doubles until they fit); the views stay."""
        if self._len + rows > self._k.shape[2]:
            self._grow(self._len + rows)
            self._views()

    def get_seq_length(self) -> int:
        return self._len if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of rows to remove (transformers 5 convention)")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self._len = max(0, self._len + tokens_to_remove)
        self._views()

    def reset(self) -> None:
        self._len = 0
        if self.is_initialized:
            self._views()


def slab_cache(config) -> DynamicCache:
    """A DynamicCache for `config` whose plain full-attention layers are SlabLayers."""
    cache = DynamicCache(config=config)
    cache.layers = [SlabLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def reserve(cache: DynamicCache, rows: int) -> None:
    """Grow every initialised SlabLayer of `cache` so that `rows` more fit without growing inside
    the next forward (a compiled forward would otherwise meet a new branch and recompile there),
    with one row to spare: a slab filled to its last row makes the view the whole, contiguous
    buffer, which compiled graphs' stride guards tell apart (a recompile of half a minute in the
    middle of a request, at that one context length)."""
    for layer in cache.layers:
        if isinstance(layer, SlabLayer) and layer.is_initialized:
            layer.reserve(rows + 1)
