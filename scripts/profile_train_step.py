"""Time the parts of one EAGLE training step on the default model (docs/benchmarks-history.md §8.1).

Usage: .venv/bin/python scripts/profile_train_step.py [--batch 4] [--tokens 400] [--draft-vocab 8192]

Prints, for two repeats: the target forward that makes features, the head forward, the soft
cross-entropy through the full lm_head (forward and backward), and a whole head step with the
cross-entropy over the first N ids (the cost of `--draft-vocab N`; which ids does not matter here).
Random token ids; the figures are seconds on this machine, noisy like any CPU timing.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    from respec.drafters.heads.eagle import LMHead
    from respec.models import load_target
    from respec.train.trainer import TrainConfig, batch_loss, head_forward, make_head, target_features

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    args = ap.parse_args()
    target = load_target("default")
    head, lm, cfg = make_head(target), LMHead.of(target, torch.float32), TrainConfig()
    sub = lm.subset(torch.arange(args.draft_vocab))
    ids = torch.randint(0, 40000, (args.batch, args.tokens), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(args.batch, args.tokens - 1, dtype=torch.bool)           # every position counts

    def head_step(out_layer: LMHead, feats: torch.Tensor) -> float:
        """Seconds for the trainer's own batch loss through `out_layer`, plus its backward."""
        t = time.perf_counter()
        batch_loss(head, target, out_layer, ids, mask, cfg, noise=False, feats=feats)["loss"].backward()
        head.zero_grad(set_to_none=True)
        return time.perf_counter() - t

    for rep in range(2):
        t = time.perf_counter()
        feats = target_features(target, ids)                                   # [B, T, H]
        t_feat = time.perf_counter() - t
        t = time.perf_counter()
        with torch.no_grad():
            head_forward(head, target.embed(ids[:, 1:]).float(), feats[:, :-1].float())
        t_head = time.perf_counter() - t
        t_ce = head_step(lm, feats) - t_head
        t_sub = head_step(sub, feats)
        print(f"repeat {rep}: target features {t_feat:.2f} s | head forward {t_head:.2f} s | full-vocab "
              f"cross-entropy fwd+bwd {t_ce:.2f} s | head step over {args.draft_vocab} ids {t_sub:.2f} s")


if __name__ == "__main__":
    main()
