"""The target seam: what the engine needs from a target language model.

Contract: a TargetModel owns one request's KV cache. `prefill` feeds the prompt; `forward_tree`
feeds one DraftTree in ONE forward pass (4D tree attention mask, explicit position ids = kv_len +
depth) without committing it; `keep(path)` then commits exactly the KV rows of the accepted path
nodes (root first) and drops the rest, so the cache always equals that of the committed text.
Logits are returned as float32 on the model's device; `hidden` are the final-norm features (the
vector fed to lm_head), which the EAGLE head consumes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from respec.tree import DraftTree


@dataclass(frozen=True)
class TargetOutput:
    logits: torch.Tensor             # [n, vocab] float32
    hidden: torch.Tensor | None      # [n, hidden] final-norm features, model dtype


class TargetModel(Protocol):
    vocab_size: int
    hidden_size: int
    eos_token_ids: frozenset[int]
    context_length: int
    device: torch.device
    dtype: torch.dtype

    @property
    def kv_len(self) -> int: ...

    def reset(self) -> None: ...

    def prefill(self, tokens: Sequence[int]) -> TargetOutput:
        """Feed the prompt; logits for the LAST position only ([1, vocab]), hidden for all ([n, H])."""

    def forward_tree(self, tree: DraftTree, need_hidden: bool = True) -> TargetOutput:
        """One forward over every tree node; logits [n + 1, vocab], hidden [n + 1, H] or None."""

    def keep(self, path: Sequence[int]) -> None:
        """Commit the KV rows of `path` (tree node indices, root first) from the last forward_tree."""

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., vocab] logits through the target's output layer."""

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """[...] token ids -> [..., H] input embeddings of the target."""
