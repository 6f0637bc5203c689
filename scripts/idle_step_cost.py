"""What a step costs when no draft pays, against a plain vanilla step (issue: never slower than vanilla).

With an untrained (seeded random) EAGLE head nothing the head drafts is ever accepted, so the cost
model must switch it off and each step must cost what a vanilla step costs. For each method this
prints, over `--rounds` interleaved rounds on the chosen questions:
- non-drafting step / vanilla step: median (draft + verify) ms of the method's root-only steps over
  the median of vanilla's steps (the per-step overhead of catch-up queueing, probing, retrieval
  lookups that found nothing);
- wall ms per target forward / vanilla's, end to end (everything the engine does per step, trace
  statistics and drafter feedback included); for eagle2 with a random head every step is a
  non-drafting one, so this is the whole overhead.
- how many steps drafted, and how many were probes.

    .venv/bin/python scripts/idle_step_cost.py [--model default] [--dtype auto]
        [--ids 81,161,241,401] [--max-new-tokens 48] [--rounds 3] [--head random|shipped]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # `python scripts/...` imports respec
import statistics

METHODS = ("eagle2", "sam", "respec", "respec-strict")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", default="../shared/spec_bench/question_dev.jsonl")
    ap.add_argument("--ids", default="81,161,241,401")
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--head", default="random", choices=("random", "shipped"),
                    help="random: a seeded untrained head (never pays); shipped: the runner's own choice")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from respec.lab.bench import load_questions
    from respec.drafters.heads.eagle import random_head
    from respec.models import load_target
    from respec.runner import Runner

    ids = [int(x) for x in args.ids.split(",")]
    questions = {q.question_id: q for q in load_questions(args.questions)}
    target = load_target(args.model, dtype=args.dtype)
    runner = Runner(target)
    if args.head == "random":
        runner.head, runner.head_info = random_head(target, seed=0), "random"
    print(f"model {args.model} ({target.dtype}), head {runner.head_info}, {args.rounds} rounds x "
          f"{len(ids)} questions x {args.max_new_tokens} tokens")
    step_ms: dict[str, list[float]] = {m: [] for m in ("vanilla",) + METHODS}
    wall_per_step: dict[str, list[float]] = {m: [] for m in step_ms}
    drafted = {m: 0 for m in step_ms}
    probes = {m: 0 for m in step_ms}
    steps_total = {m: 0 for m in step_ms}
    for _ in range(args.rounds):
        for qid in ids:
            for method in step_ms:          # interleaved, so machine noise hits every method alike
                res = runner.generate(questions[qid].turns[0], runner.config(
                    method=method, max_new_tokens=args.max_new_tokens))
                idle = [s.draft_ms + s.verify_ms for s in res.steps if s.num_draft == 0]
                step_ms[method].extend(idle)
                wall_per_step[method].append(res.wall_time_s * 1000 / (len(res.steps) + 1))
                drafted[method] += sum(1 for s in res.steps if s.num_draft > 0)
                probes[method] += sum(1 for s in res.steps if s.decision is not None
                                      and "auto probe" in s.decision.reason)
                steps_total[method] += len(res.steps)
    base_step = statistics.median(step_ms["vanilla"])
    base_wall = statistics.median(wall_per_step["vanilla"])
    print("| method | non-drafting step / vanilla step | wall per forward / vanilla | steps drafted | probes |")
    print("|---|---|---|---|---|")
    for method in step_ms:
        idle = step_ms[method]
        ratio = f"{statistics.median(idle) / base_step:.3f} ({len(idle)} steps)" if idle else "– (0 steps)"
        print(f"| {method} | {ratio} | {statistics.median(wall_per_step[method]) / base_wall:.3f} | "
              f"{drafted[method]} of {steps_total[method]} | {probes[method]} |")
    print(f"vanilla: median step {base_step:.1f} ms, median wall per forward {base_wall:.1f} ms")


if __name__ == "__main__":
    main()
