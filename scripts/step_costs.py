"""Where a step's time goes. Part 1: median draft and verify ms per step (and MAT) of eagle2 with
fixed trees of a few sizes and of vanilla, on chosen Spec-Bench questions. Part 2: the work on the
logits after a tree forward of `--nodes` nodes (lm_head, fp32 copy, argmax, read_numbers),
median ms of 20 calls each.

    .venv/bin/python scripts/step_costs.py [--questions FILE] [--ids 81,201] [--nodes 48]
"""
from __future__ import annotations

import argparse
import statistics
import time

TREES = {"48 nodes, depth 6, top-k 8": {"tree.total_tokens": 48, "tree.depth": 6, "tree.top_k": 8},
         "16 nodes, depth 4, top-k 4": {"tree.total_tokens": 16, "tree.depth": 4, "tree.top_k": 4}}


def _median_ms(fn, reps: int = 20) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main() -> None:
    import torch

    from respec.lab.bench import load_questions
    from respec.models import load_target
    from respec.runner import Runner
    from respec.tree import DraftTree
    from respec.verify import read_numbers

    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", default="../shared/spec_bench/question_dev.jsonl")
    ap.add_argument("--ids", default="81,201")
    ap.add_argument("--nodes", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    ids = [int(x) for x in args.ids.split(",")]
    questions = {q.question_id: q for q in load_questions(args.questions)}
    target = load_target("default")
    runner = Runner(target)
    print("| run | question | steps | MAT | median draft ms | median verify ms |")
    print("|---|---|---|---|---|---|")
    runs = [(name, {"method": "eagle2", "tree.auto": False, **tree}) for name, tree in TREES.items()]
    for name, overrides in runs + [("vanilla", {"method": "vanilla"})]:
        for qid in ids:
            cfg = runner.config({**overrides, "max_new_tokens": args.max_new_tokens})
            res = runner.generate(questions[qid].turns[0], cfg)
            steps = res.steps
            print(f"| {name} | {qid} | {len(steps)} | {len(res.tokens) / max(1, len(steps)):.2f} | "
                  f"{statistics.median(s.draft_ms for s in steps):.1f} | "
                  f"{statistics.median(s.verify_ms for s in steps):.1f} |")
    n = args.nodes
    tree = DraftTree.from_parents([5 + i for i in range(n)], [-1] + [(i - 1) // 3 for i in range(1, n)], "eagle")
    hidden = torch.randn(n, target.hidden_size, dtype=target.dtype, device=target.device)   # [n, H]
    with torch.inference_mode():
        logits = target.lm_head(hidden)
        full = logits.float()                                                                 # [n, V]
        parts = {"lm_head": lambda: target.lm_head(hidden), "fp32 copy": logits.float,
                 "argmax": lambda: full.argmax(-1).tolist(),
                 "read_numbers": lambda: read_numbers(tree, full)}
        print(f"\nwork on the logits of a {n}-node tree, median ms of 20 calls:")
        for name, fn in parts.items():
            print(f"  {name}: {_median_ms(fn):.2f}")


if __name__ == "__main__":
    main()
