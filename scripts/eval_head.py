"""Validation top-1 of an EAGLE head per draft depth, on the held-out split of the stored responses.

    .venv/bin/python scripts/eval_head.py [--head assets/eagle/smollm2-135m-instruct] [--depth 3] [--dtype float32]

The split is the trainer's (a hash of each example's key, `--val-fraction`, at most `--val-max`
examples), so a head trained by `train-eagle` on the same store is scored on examples it never
trained on. Depth d > 1 feeds the head its own predicted features, as drafting does (the trainer's
unrolled `--ttt-depth` evaluation). Top-1 counts a hit when the head's argmax over its draft
vocabulary (all ids if it has none) equals the target's next token.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # `python scripts/...` imports respec


def main() -> None:
    from respec.drafters.heads.eagle import LMHead
    from respec.drafters.heads.checkpoint import load_eagle_head
    from respec.models import load_target
    from respec.train.data import ResponseStore, target_slug
    from respec.train.pipeline import default_data_dir
    from respec.train.trainer import TrainConfig, evaluate, split, train_dtype

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--head", default="assets/eagle/smollm2-135m-instruct")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--val-fraction", type=float, default=0.05)
    ap.add_argument("--val-max", type=int, default=64)
    ap.add_argument("--dtype", default="auto", help="the target's dtype: auto | bfloat16 | float32")
    args = ap.parse_args()
    target = load_target(args.model, dtype=args.dtype)
    store = ResponseStore(args.data_dir or default_data_dir(target_slug(target)))
    _, val = split(store.examples(), args.val_fraction, args.val_max)
    head = load_eagle_head(args.head, target, train_dtype(target))
    lm = LMHead.of(target, train_dtype(target))
    if getattr(head, "draft_vocab", None) is not None:
        lm = lm.subset(head.draft_vocab)
    cfg = dataclasses.replace(TrainConfig(), ttt_depth=args.depth, max_len=args.max_len, batch_size=4)
    r = evaluate(head, target, lm, val, cfg)
    row = {"head": args.head, "val_examples": len(val), "val_tokens": r["tokens"], "top1_depth1": round(r["top1"], 4),
           **{k: round(v, 4) for k, v in r.items() if k.startswith("top1_depth")}}
    print(json.dumps(row))


if __name__ == "__main__":
    main()
