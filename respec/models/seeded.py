"""Seeded weight initialisation that leaves the global RNG alone.

Contract: `seeded_init_(module, seed)` re-draws every `nn.Linear` weight and bias inside `module` from a local
`torch.Generator` seeded with `seed`, with PyTorch's default distributions (Kaiming-uniform weights, uniform biases
in +-1/sqrt(fan_in)); other parameters (norm weights, buffers) keep what their constructor set. Same module shape
and seed -> bit-identical Linear weights, whatever the global RNG state, and the global RNG is neither read nor
reseeded (`torch.manual_seed` would reseed every other user of it, e.g. a sampler in another thread).
`built_without_global_rng(factory)` runs a constructor inside a fork of the CPU RNG, so the draws its default init
makes from the global RNG are undone.

Nothing runs at import time.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


def built_without_global_rng(factory: Callable[[], M]) -> M:
    """`factory()` with the CPU global RNG state restored afterwards (its default init draws are discarded)."""
    with torch.random.fork_rng(devices=[]):
        return factory()


@torch.no_grad()
def seeded_init_(module: M, seed: int) -> M:
    """Re-initialise every nn.Linear in `module` (in `module.modules()` order) from a local generator; returns it."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    for layer in module.modules():
        if not isinstance(layer, nn.Linear):
            continue
        weight = torch.empty(layer.weight.shape, dtype=layer.weight.dtype)              # [out, in] on CPU
        nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)
        layer.weight.copy_(weight)
        if layer.bias is not None:
            bound = 1 / math.sqrt(layer.in_features) if layer.in_features > 0 else 0.0
            layer.bias.copy_(torch.empty(layer.bias.shape, dtype=layer.bias.dtype).uniform_(-bound, bound,
                                                                                            generator=generator))
    return module
