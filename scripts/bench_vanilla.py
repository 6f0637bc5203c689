"""Benchmark: the engine's own vanilla loop against transformers' `model.generate` (greedy, same
model, same prompts, same number of new tokens). Prints tokens/s of both and their ratio.

    .venv/bin/python scripts/bench_vanilla.py [--model default] [--max-new-tokens 96] [--prompts 6]

Both decoders run alternately per prompt after one warm-up each, so machine noise hits them alike.
The outputs are also compared token for token (they must be identical: same forward, same argmax).
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
    tot = {"hf": [0, 0.0], "ours": [0, 0.0]}
    same = 0
    for p in prompts:
        ids = runner.encode(p)
        a, ta = hf(ids)
        b, tb = ours(ids)
        same += a == b
        tot["hf"][0] += len(a); tot["hf"][1] += ta
        tot["ours"][0] += len(b); tot["ours"][1] += tb
        print(f"prompt {len(ids):5d} tokens: generate {len(a)/ta:6.2f} tok/s | engine vanilla {len(b)/tb:6.2f} tok/s")
    hf_tps = tot["hf"][0] / tot["hf"][1]
    our_tps = tot["ours"][0] / tot["ours"][1]
    print(f"overall: model.generate {hf_tps:.2f} tok/s, engine vanilla {our_tps:.2f} tok/s, "
          f"ratio {our_tps / hf_tps:.3f}; identical outputs {same}/{len(prompts)} "
          f"({target.device}, {str(target.dtype).replace('torch.', '')})")


if __name__ == "__main__":
    main()
