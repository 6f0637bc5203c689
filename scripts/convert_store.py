"""Carry a response store over to another target's tokenizer (respec/train/store_convert.py), checked by the
benchmark guard, and write it as the target's store beside the tokenizer files its CI check needs.

    .venv/bin/python scripts/convert_store.py --source data/eagle/smollm2-135m-instruct --source-model default \\
        --target-model qwen2.5-coder-1.5b --out data/eagle/qwen2-5-coder-1-5b-instruct

Writes `--out/responses-NNNNN.jsonl` (chunks of `--chunk` records, the store's format) and `--out/tokenizer/`
(the target's tokenizer, its tokenizer.json gzipped, so tests decode the store without the model's weights). Refuses a non-empty --out.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # `python scripts/...` imports respec


def main() -> int:
    from respec.errors import RespecError
    from respec.models.loading import load_tokenizer
    from respec.train.data import ResponseStore
    from respec.train.exclusion import BenchmarkGuard
    from respec.train.pipeline import default_spec_bench
    from respec.train.store_convert import convert_records, save_store_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, required=True, help="the store to carry over")
    ap.add_argument("--source-model", default="default", help="the model whose tokenizer wrote --source")
    ap.add_argument("--target-model", required=True, help="the model to re-encode for (e.g. qwen2.5-coder-1.5b)")
    ap.add_argument("--out", type=Path, required=True, help="the new store (must be empty or absent)")
    ap.add_argument("--chunk", type=int, default=512, help="records per chunk file")
    args = ap.parse_args()
    try:
        if args.out.exists() and any(args.out.iterdir()):
            raise RespecError(f"{args.out} is not empty; remove it or name another --out")
        records = ResponseStore(args.source).records()
        if not records:
            raise RespecError(f"{args.source} holds no responses-*.jsonl records")
        source, target = load_tokenizer(args.source_model), load_tokenizer(args.target_model)
        done = convert_records(records, source, target)
        guard = BenchmarkGuard.load([default_spec_bench()] if default_spec_bench().is_file() else [])
        guard.check_prompts([(r["key"], target.decode(r["prompt_ids"])) for r in done.records],
                            what="converted responses")
        store = ResponseStore(args.out)
        for i in range(0, len(done.records), args.chunk):
            store.append(list(done.records[i:i + args.chunk]))
        save_store_tokenizer(target, args.out)
    except RespecError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    tokens = sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in done.records)
    print(f"{len(done.records)} of {len(records)} records carried over ({tokens} tokens); skipped "
          f"{done.skipped_not_chatml} not ChatML, {done.skipped_empty} empty; written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
