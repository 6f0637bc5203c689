"""Print the target's verify-cost curve: milliseconds of one tree forward of n tokens after a
context of C cached tokens (the same measurement `tree.auto` uses), and its ratio to n = 1.

    .venv/bin/python scripts/verify_cost.py [--model default] [--context 768] [--dtype float32]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # `python scripts/...` imports respec


def main() -> None:
    from respec.models import load_target

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--context", type=int, default=768)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--dtype", default="auto", help="auto | bfloat16 | float16 | float32")
    args = ap.parse_args()
    target = load_target(args.model, dtype=args.dtype)
    curve = target.verify_cost_curve(max_size=64, context=args.context, reps=args.reps)
    print(f"{target.name} on {target.device} ({str(target.dtype).replace('torch.', '')}), "
          f"context {args.context} tokens; fastest of {args.reps} interleaved rounds")
    print("| tree tokens | " + " | ".join(str(n) for n in curve) + " |")
    print("|---|" + "---|" * len(curve))
    print("| ms | " + " | ".join(f"{v:.1f}" for v in curve.values()) + " |")
    print("| x one token | " + " | ".join(f"{v / curve[1]:.2f}" for v in curve.values()) + " |")


if __name__ == "__main__":
    main()
