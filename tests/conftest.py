"""Shared fixtures: tiny random-init targets built from configs (fp64, exact on CPU), oracle
drafters that know the vanilla continuation, and helpers to run a method end to end."""
from __future__ import annotations

import random
from typing import Sequence

import pytest
import torch

from respec.config import EngineConfig
from respec.drafters import make_drafter
from respec.drafters.base import DraftContext, Proposal, StepOutcome
from respec.engine import Engine
from respec.models.hf import HFTarget
from respec.models.tiny import tiny_llama, tiny_qwen2
from respec.tree import DraftTree

EOS = 2


def make_target(arch: str, seed: int = 0, dtype=torch.float64) -> HFTarget:
    model = (tiny_llama if arch == "llama" else tiny_qwen2)(seed=seed, dtype=dtype)
    return HFTarget(model, eos_token_ids=frozenset({EOS}), context_length=256, name=f"tiny-{arch}")


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_target(request) -> HFTarget:
    return make_target(request.param)


def run(target, method: str, prompt: Sequence[int], drafter=None, head=None, **overrides):
    cfg = EngineConfig().with_overrides({"method": method, **overrides})
    drafter = drafter or make_drafter(method, target, cfg, head=head)
    return Engine(target, drafter, cfg).generate(prompt)


class OracleDrafter:
    """Proposes trees around a precomputed vanilla continuation `reference` (generated tokens).

    mode "same": the right chain of `depth` tokens, hidden among wrong siblings (a real tree);
    mode "random": random tokens only; mode "partial": right for a random number of tokens, then wrong.
    """
    needs_hidden = False
    feature_layers = None

    def __init__(self, reference: Sequence[int], prompt_len: int, mode: str, vocab: int,
                 depth: int = 4, width: int = 3, seed: int = 0, source: str = "eagle") -> None:
        self.name = f"oracle-{mode}"
        self.ref, self.prompt_len, self.mode = list(reference), prompt_len, mode
        self.vocab, self.depth, self.width, self.source = vocab, depth, width, source
        self.rng = random.Random(seed)

    def reset(self, prompt, prompt_hidden) -> None:
        pass

    def observe(self, outcome: StepOutcome) -> None:
        pass

    def _wrong(self, right: int) -> int:
        t = self.rng.randrange(self.vocab)
        return t if t != right else (t + 1) % self.vocab

    def propose(self, ctx: DraftContext) -> Proposal:
        j = len(ctx.tokens) - self.prompt_len           # ctx.root == reference[j]
        right = self.ref[j + 1:j + 1 + self.depth]
        right += [self.rng.randrange(self.vocab) for _ in range(self.depth - len(right))]
        if self.mode == "random":
            chain = [self._wrong(t) for t in right]
        elif self.mode == "partial":
            cut = self.rng.randrange(self.depth + 1)
            chain = right[:cut] + [self._wrong(t) for t in right[cut:]]
        else:
            chain = right
        tokens, parents = [ctx.root], [-1]
        parent = 0
        for t in chain:                                  # wrong siblings first, so paths are non-prefix
            for _ in range(self.width - 1):
                tokens.append(self._wrong(t)); parents.append(parent)
            tokens.append(t); parents.append(parent)
            parent = len(tokens) - 1
        cap = min(len(tokens), ctx.max_nodes)
        tree = DraftTree.from_parents(tokens[:cap], parents[:cap], self.source)
        return Proposal(tree=tree, source=self.source)


def inject_costs(monkeypatch, target, curve: dict[int, float], row_ms: float) -> None:
    """Decisions from given costs, not the clock: the target's verify-cost curve is `curve`, a head
    row costs `row_ms`, and observed step times do not shift the curve. A test that reads the clock
    has a verdict that depends on the machine (the tiny models' steps cost about the same at every
    size, so a draft's rate sits near 1.0x and flips with noise)."""
    from respec.cost import CostModel
    from respec.drafters.heads.eagle import EagleHead
    monkeypatch.setattr(target, "verify_cost_curve",
                        lambda max_size=64, **_: {n: ms for n, ms in curve.items() if n <= max(max_size, 2)})
    monkeypatch.setattr(CostModel, "observe", lambda self, size, verify_ms: None)
    monkeypatch.setattr(EagleHead, "row_ms", lambda self, target, reps=3: row_ms)
