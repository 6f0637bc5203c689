"""Interleaved A/B of settings: each question runs vanilla once, then every method under every
named variant, one after another, so a burst of machine noise hits every variant alike (one
`bench` run per variant spreads them minutes apart). Prints overall tokens/s, speedup over vanilla
and MAT (committed tokens per target forward) per method and variant.

    .venv/bin/python scripts/ab_settings.py --methods eagle2,respec \\
        --variant 'cut={}' --variant 'no cut={"tree.depth_cut": false}' [--per-category 2]
        [--max-new-tokens 96] [--model default] [--head default] [--questions FILE]

Each variant is a name and a JSON object of settings (dotted keys or aliases, as for `--set`)
applied over the device defaults. Greedy methods are lossless whatever the variant; relaxed ones
(respec) may take different paths, so their MAT moves with the text as well as the setting.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # `python scripts/...` imports respec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", required=True)
    ap.add_argument("--variant", action="append", required=True, metavar="NAME=JSON")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--model", default="default")
    ap.add_argument("--head", default=None, help="an EAGLE head directory (default: the runner's choice)")
    ap.add_argument("--questions", default="../shared/spec_bench/question_dev.jsonl")
    args = ap.parse_args()

    from respec.lab.bench import load_questions
    from respec.models import load_target
    from respec.runner import Runner, parse_methods

    variants = {}
    for item in args.variant:
        name, _, settings = item.partition("=")
        variants[name] = json.loads(settings or "{}")
    methods = parse_methods(args.methods)
    questions = load_questions(args.questions, limit_per_category=args.per_category)
    target = load_target(args.model)
    runner = Runner(target, head=args.head)
    print(f"model {args.model} ({target.dtype}), head {runner.head_info}, {len(questions)} questions x "
          f"{args.max_new_tokens} tokens, variants {variants}")
    runs = [("vanilla", "-", {})] + [(m, v, s) for m in methods for v, s in variants.items()]
    for method, _, settings in runs:                 # warm-up: first calls of a shape pay allocation
        runner.generate(questions[0].turns[0], runner.config(settings, method=method, max_new_tokens=8))
    wall, tokens, steps = collections.Counter(), collections.Counter(), collections.Counter()
    for q in questions:
        for method, name, settings in runs:
            res = runner.generate(q.turns[0], runner.config(settings, method=method,
                                                            max_new_tokens=args.max_new_tokens))
            wall[method, name] += res.wall_time_s
            tokens[method, name] += len(res.tokens)
            steps[method, name] += len(res.steps) + 1          # + the prefill's token
    base = tokens["vanilla", "-"] / wall["vanilla", "-"]
    print("| method | variant | tokens/s | speedup | MAT |\n|---|---|---|---|---|")
    for method, name, _ in runs:
        tps, mat = tokens[method, name] / wall[method, name], tokens[method, name] / steps[method, name]
        print(f"| {method} | {name} | {tps:.2f} | {tps / base:.3f}x | {mat:.2f} |")


if __name__ == "__main__":
    main()
