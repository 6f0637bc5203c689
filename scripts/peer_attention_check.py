"""Check that switching the model to "respec_sdpa" (respec/models/attention.py) leaves the hf peers
alone: transformers' prompt lookup (`hf-pld`, as the benchmark runs it) on chosen questions, once
with the model on "respec_sdpa" and once back on stock "sdpa", in one process. Prints the new-token
count and forward count of each, and whether the token ids are identical.

    .venv/bin/python scripts/peer_attention_check.py [--questions FILE] [--ids 161,162,163,165,166]
"""
from __future__ import annotations

import argparse


def main() -> None:
    from respec.lab.bench import hf_generate, load_questions
    from respec.models import load_target
    from respec.models.attention import NAME
    from respec.runner import Runner

    ap = argparse.ArgumentParser()
    ap.add_argument("--questions", default="../shared/spec_bench/question_dev.jsonl")
    ap.add_argument("--ids", default="161,162,163,165,166")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    ids = [int(x) for x in args.ids.split(",")]
    questions = {q.question_id: q for q in load_questions(args.questions)}
    target = load_target("default")
    runner = Runner(target)
    print(f"| question | {NAME}: tokens, forwards | sdpa: tokens, forwards | identical |")
    print("|---|---|---|---|")
    for qid in ids:
        ids_in = runner.encode([{"role": "user", "content": questions[qid].turns[0]}])
        out = {}
        for impl in (NAME, "sdpa"):
            target.model.set_attn_implementation(impl)
            new, _, calls = hf_generate(runner, ids_in, "hf-pld", args.max_new_tokens)
            out[impl] = (new, calls)
        target.model.set_attn_implementation(NAME)
        (a, fa), (b, fb) = out[NAME], out["sdpa"]
        print(f"| {qid} | {len(a)}, {fa} | {len(b)}, {fb} | {a == b} |")


if __name__ == "__main__":
    main()
