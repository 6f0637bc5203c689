"""Print the target's verify-cost curve: milliseconds of one tree forward of n tokens after a
context of C cached tokens (the same measurement `tree.auto` uses), and its ratio to n = 1; then
the machine's measured memory bandwidth and matmul throughput (a few seconds of torch operations,
respec/lab/roofline.py) and, per size, the roofline bound they imply (weights and cached keys and
values read once / bandwidth, or FLOPs / throughput, whichever is larger) and the forward's distance
from it; then the same at the read bandwidth (a large tensor summed: a forward reads its weights and
writes next to nothing, so on a machine where reads alone run slower than a copy the first bound
asks for more than the memory can give). `--no-bound` skips this part.

    .venv/bin/python scripts/verify_cost.py [--model default] [--context 768] [--dtype float32] [--compile both]
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
    ap.add_argument("--no-bound", action="store_true", help="skip the bandwidth/throughput measurement")
    ap.add_argument("--compile", default="off", choices=["off", "on", "both"],
                    help="time the eager forward (off), the compiled one (on), or both in this run, "
                         "eager first, with the compiled/eager ratio per size")
    args = ap.parse_args()
    target = load_target(args.model, dtype=args.dtype)
    curves = {}
    if args.compile in ("off", "both"):
        curves["eager"] = target.verify_cost_curve(max_size=64, context=args.context, reps=args.reps)
    if args.compile in ("on", "both"):
        seconds = target.enable_compile()
        print(f"compiled and warmed up in {seconds:.0f} s")
        curves["compiled"] = target.verify_cost_curve(max_size=64, context=args.context, reps=args.reps)
    print(f"{target.name} on {target.device} ({str(target.dtype).replace('torch.', '')}), "
          f"context {args.context} tokens; fastest of {args.reps} interleaved rounds")
    for label, curve in curves.items():
        print(f"\n{label} forward")
        print("| tree tokens | " + " | ".join(str(n) for n in curve) + " |")
        print("|---|" + "---|" * len(curve))
        print("| ms | " + " | ".join(f"{v:.1f}" for v in curve.values()) + " |")
        print("| x one token | " + " | ".join(f"{v / curve[1]:.2f}" for v in curve.values()) + " |")
    if len(curves) == 2:
        eager, comp = curves["eager"], curves["compiled"]
        # the compiled curve adds the sizes where its padded graphs step (3, 5 ...): no eager figure there
        print("| eager / compiled | " + " | ".join(f"{eager[n] / comp[n]:.2f}" if n in eager else "–"
                                                  for n in comp) + " |")
    if not args.no_bound:
        print_bound(target, curves.get("compiled") or curves["eager"], args.context)


def print_bound(target, curve: dict[int, float], context: int) -> None:
    from respec.lab.roofline import forward_bound, measure_machine, target_profile

    limits = measure_machine(target.device, target.dtype)
    profile = target_profile(target)
    print(f"\nmachine: memory bandwidth {limits.bandwidth_gbs:.1f} GB/s (copy, read + write), "
          f"{limits.read_gbs:.1f} GB/s read (a sum), "
          f"{limits.dtype} matmul {limits.dtype_gflops or limits.matmul_gflops:.0f} GFLOP/s"
          + (f" (float32 {limits.matmul_gflops:.0f}, faster here: the bound's)"
             if limits.matmul_gflops > limits.dtype_gflops else "") + f"; model: {profile.weight_bytes / 1e6:.0f} MB "
          f"of weights, {profile.kv_bytes_per_token / 1e3:.1f} kB of keys/values per cached token")
    bounds = {n: forward_bound(profile, limits, n, context) for n in curve}
    print("| tree tokens | " + " | ".join(str(n) for n in curve) + " |")
    print("|---|" + "---|" * len(curve))
    print("| bound ms | " + " | ".join(f"{b['bound_ms']:.1f}" for b in bounds.values()) + " |")
    print("| bound by | " + " | ".join("memory" if b["memory_ms"] >= b["compute_ms"] else "compute"
                                       for b in bounds.values()) + " |")
    print("| x bound | " + " | ".join(f"{curve[n] / bounds[n]['bound_ms']:.2f}" for n in curve) + " |")
    if all("read_bound_ms" in b for b in bounds.values()):     # the same bytes at the read bandwidth
        print("| read bound ms | " + " | ".join(f"{b['read_bound_ms']:.1f}" for b in bounds.values()) + " |")
        print("| x read bound | " + " | ".join(f"{curve[n] / bounds[n]['read_bound_ms']:.2f}" for n in curve) + " |")


if __name__ == "__main__":
    main()
