"""Benchmark: the engine's own vanilla loop against transformers' `model.generate` (greedy, same
model, same prompts, same number of new tokens). Prints tokens/s of both and their ratio.

    .venv/bin/python scripts/bench_vanilla.py [--model default] [--max-new-tokens 96] [--prompts 6]

Both decoders run alternately per prompt (--reps times each, after one warm-up each) and each
prompt's speed is the median of its repetitions, so a burst of load from another process does not
decide the ratio. The outputs are also compared token for token (same forward, same argmax).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

QUESTIONS = Path(__file__).resolve().parent.parent.parent / "shared" / "spec_bench" / "question_dev.jsonl"


def main() -> None:
    from respec.config import EngineConfig
    from respec.models import load_target
    from respec.runner import Runner

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--questions", default=str(QUESTIONS))
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()

    target = load_target(args.model)
    runner = Runner(target)
    rows = [json.loads(l) for l in Path(args.questions).read_text().splitlines() if l.strip()]
    seen, prompts = set(), []
    for r in rows:  # one prompt per category, round robin
        if r["category"] not in seen:
            seen.add(r["category"]); prompts.append(r["turns"][0])
    prompts = prompts[: args.prompts]
    cfg = EngineConfig(method="vanilla", max_new_tokens=args.max_new_tokens)
    model = target.model

    def hf(ids):
        x = torch.tensor([ids], device=target.device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.max_new_tokens,
                                 min_new_tokens=args.max_new_tokens, do_sample=False, num_beams=1,
                                 eos_token_id=None, pad_token_id=0)
        return out[0, len(ids):].tolist(), time.perf_counter() - t0

    def ours(ids):
        engine = runner.engine(cfg)
        engine.stop_token_ids = frozenset()     # same length as generate with min_new_tokens
        r = engine.generate(ids)
        return list(r.tokens), r.wall_time_s

    ids0 = runner.encode("Hello!")
    hf(ids0); ours(ids0)
    import statistics
    speeds = {"hf": [], "ours": []}
    same = 0
    for p in prompts:
        ids = runner.encode(p)
        runs = {"hf": [], "ours": []}
        for _ in range(args.reps):
            a, ta = hf(ids)
            b, tb = ours(ids)
            runs["hf"].append(len(a) / ta)
            runs["ours"].append(len(b) / tb)
        same += a == b
        for k in runs:
            speeds[k].append(statistics.median(runs[k]))
        print(f"prompt {len(ids):5d} tokens: generate {speeds['hf'][-1]:6.2f} tok/s | "
              f"engine vanilla {speeds['ours'][-1]:6.2f} tok/s  (medians of {args.reps})")
    hf_tps = statistics.mean(speeds["hf"])
    our_tps = statistics.mean(speeds["ours"])
    print(f"overall: model.generate {hf_tps:.2f} tok/s, engine vanilla {our_tps:.2f} tok/s, "
          f"ratio {our_tps / hf_tps:.3f}; identical outputs {same}/{len(prompts)} "
          f"({target.device}, {str(target.dtype).replace('torch.', '')})")


if __name__ == "__main__":
    main()
