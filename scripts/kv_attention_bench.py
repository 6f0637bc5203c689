"""Compare the target adapter's forward + keep time with transformers' stock cache and attention
("stock": DynamicCache, stock sdpa with repeat_kv under a mask) against ours ("ours": the slab KV
cache of respec/models/kv.py, grouped-query SDPA for masked multi-token forwards and the query
packed per KV head for one-token forwards, from respec/models/attention.py). Both run in one
process, interleaved round by round, so machine noise hits both alike. Prints the median
milliseconds per shape and context as a Markdown table.

    .venv/bin/python scripts/kv_attention_bench.py [--model default] [--contexts 200,800] [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    from transformers import DynamicCache

    import respec.models.hf as hf
    from respec.models import load_target
    from respec.tree import DraftTree

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default")
    ap.add_argument("--contexts", default="200,800")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    target = load_target(args.model)
    ours_kwargs = dict(target._tree_kwargs)
    variants = {"stock": (lambda config: DynamicCache(config=config), {}), "ours": (hf.slab_cache, ours_kwargs)}
    tree16 = ([5 + i for i in range(16)], [-1, 0, 0, 0, 0, 1, 1, 2, 3, 5, 5, 6, 9, 9, 10, 12])
    shapes = {
        "1 token": (lambda: DraftTree.chain(7, [], "eagle"), [0]),
        "10-token chain": (lambda: DraftTree.chain(7, list(range(8, 17)), "retrieval"), [0, 1, 2]),
        "16-node tree": (lambda: DraftTree.from_parents(*tree16, "eagle"), [0, 2, 7]),
    }
    print(f"{target.name} on {target.device} ({str(target.dtype).replace('torch.', '')}); median ms of "
          f"forward_tree + keep, {args.rounds} rounds x 4 calls per shape")
    print("| context | shape | stock | ours | ours / stock |")
    print("|---|---|---|---|---|")
    for ctx in (int(c) for c in args.contexts.split(",")):
        prompt = [1000 + i % 5000 for i in range(ctx)]
        ms: dict[tuple[str, str], list[float]] = {(v, s): [] for v in variants for s in shapes}
        for _ in range(args.rounds + 1):                   # the first round warms up and is dropped
            for name, (factory, kwargs) in variants.items():
                hf.slab_cache, target._tree_kwargs = factory, kwargs
                target.prefill(prompt)
                for shape, (make, keep) in shapes.items():
                    for _ in range(4):
                        t0 = time.perf_counter()
                        target.forward_tree(make())
                        target.keep(keep)
                        ms[(name, shape)].append((time.perf_counter() - t0) * 1000)
        for shape in shapes:
            stock, ours = (statistics.median(ms[(v, shape)][4:]) for v in variants)
            print(f"| {ctx} | {shape} | {stock:.1f} | {ours:.1f} | {ours / stock:.2f} |")
    hf.slab_cache, target._tree_kwargs = variants["ours"][0], ours_kwargs


if __name__ == "__main__":
    main()
