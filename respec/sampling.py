"""Logits -> probabilities, entropies and seeded sampling. Pure functions, fp32 math.

Contract: `logits` rows are raw target logits; `probs_from_logits` applies temperature, top-k and
top-p (in that order, as transformers' processors do) and returns float32 probabilities on the
logits' device. Entropy is in nats over the untempered fp32 softmax. Randomness always comes from a
caller-supplied `torch.Generator` (built once per run from the seed; never reseeded in the loop).
"""
from __future__ import annotations

import torch

from respec.config import SamplingConfig
from respec.transfer import to_host


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """logits: [..., vocab] -> [...] entropy in nats of softmax(logits) computed in fp32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def probs_from_logits(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """logits: [n, vocab] -> [n, vocab] float32 probabilities after temperature / top-k / top-p.
    Requires cfg.temperature > 0 (greedy decoding never needs probabilities)."""
    if cfg.temperature <= 0:
        raise ValueError("probs_from_logits needs temperature > 0")
    x = logits.float() / cfg.temperature
    if cfg.top_k is not None and cfg.top_k < x.shape[-1]:
        kth = torch.topk(x, cfg.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if cfg.top_p is not None and cfg.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(-1)
        # drop a token when the mass strictly before it already reaches top_p (the top-1 always stays)
        drop_sorted = (cum - torch.softmax(sorted_x, dim=-1)) >= cfg.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        x = x.masked_fill(drop, float("-inf"))
    return torch.softmax(x, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """probs: [vocab] (any device) -> one token id drawn with `generator` (a CPU generator)."""

    p = to_host(probs.detach(), "sample").to(torch.float64)
    return int(torch.multinomial(p / p.sum(), 1, generator=generator).item())
