"""Seeded initialisation without the global RNG: a random EAGLE head is a function of its seed alone, and
building one leaves the caller's global RNG exactly where it was (no reseeding as a side effect)."""
from __future__ import annotations

import torch

from respec.drafters.heads.eagle import random_head
from respec.models.seeded import seeded_init_
from tests.conftest import make_target


def test_a_random_head_leaves_the_global_rng_alone_and_depends_only_on_its_seed():
    target = make_target("llama")
    torch.manual_seed(1234)
    expected_next = torch.rand(4)
    torch.manual_seed(1234)
    first = random_head(target, seed=7)
    assert torch.equal(torch.rand(4), expected_next), "building a random head must not touch the global RNG"
    torch.manual_seed(999)                                   # a different global state: same head
    second = random_head(target, seed=7)
    other = random_head(target, seed=8)
    for (name, a), b, c in zip(first.state_dict().items(), second.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b), f"{name}: same seed, different weights"
    assert not torch.equal(first.fc.weight, other.fc.weight), "a different seed must give different weights"


def test_seeded_init_redraws_every_linear_with_default_bounds():
    layer = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4, bias=False))
    seeded_init_(layer, 0)
    bound = 1 / 16 ** 0.5                                    # kaiming_uniform(a=sqrt(5)) = U(+-1/sqrt(fan_in))
    assert layer[0].weight.abs().max() <= bound and layer[0].bias.abs().max() <= bound
    again = seeded_init_(torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(),
                                             torch.nn.Linear(8, 4, bias=False)), 0)
    assert torch.equal(layer[2].weight, again[2].weight), "same seed, same weights"
