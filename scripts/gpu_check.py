"""One short check on a CUDA machine with no network (also runs on a CPU with `--device cpu`).

    python scripts/gpu_check.py [--device cuda] [--model auto|default|random-7b|tiny]
                                [--max-new-tokens 64] [--out gpu-check.json]

1. Exactness: on tiny float64 Llama and Qwen2 models built from configs on the device, every strict
   method (eagle2, sam, respec-strict, respec with relax.budget=0) must equal vanilla greedy output
   token for token on three prompts.
2. The verify-cost curve of the speed model: milliseconds of one target forward of 1..64 tree tokens
   after 512 cached tokens. It bounds any method's speedup on this device. The speed model is the
   default model when its cache is here (`auto`), else a randomly initialised model of Llama-2-7B's
   shape in bf16 (`random-7b`; its tokens are noise, but its timings are a 7B model's).
3. Tokens/s per method on three prompts with the device defaults (tree.auto), speedup over vanilla,
   mean accepted length (bonus included), and whether each output is lossless against vanilla
   (identical, or first diverging where vanilla's top-1/top-2 gap is within the dtype's rounding).
Everything is printed and written as JSON to --out. Exit status 1 if an exactness check fails.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STRICT = {"eagle2": {}, "sam": {"sam.len_threshold": 2}, "respec-strict": {"trigger.theta_entropy": 20.0},
          "respec": {"relax.budget": 0, "trigger.theta_entropy": 20.0}}
SPEED_METHODS = ("vanilla", "eagle2", "sam", "respec", "respec-strict")
TEXT_PROMPTS = ("List the days of the week, one per line, then list them again.",
                "Summarize in two sentences: speculative decoding drafts several tokens cheaply and verifies "
                "them with one forward pass of the large model, which keeps the output unchanged.",
                "Write a Python function that returns the n-th Fibonacci number, then explain it.")


def id_prompts(vocab: int) -> list[list[int]]:
    """Token-id prompts with repeats (so retrieval has matches) for models without a tokenizer."""
    base = [(7 * i + 3) % (vocab - 3) + 3 for i in range(24)]
    return [base + base[:12], [5, 6, 7, 8, 9, 10] * 6, list(range(40, 80)) + list(range(40, 60))]


def exactness(device: str) -> list[dict]:
    import torch

    from respec.config import EngineConfig
    from respec.drafters import make_drafter
    from respec.engine import Engine
    from respec.models.hf import HFTarget
    from respec.models.tiny import EOS, tiny_llama, tiny_qwen2

    out = []
    for arch, build in (("llama", tiny_llama), ("qwen2", tiny_qwen2)):
        model = build(seed=1, dtype=torch.float64).to(device)
        target = HFTarget(model, eos_token_ids=frozenset({EOS}), context_length=256, name=f"tiny-{arch}")
        for p, prompt in enumerate(id_prompts(128)):
            def run(method, extra):
                cfg = EngineConfig().with_overrides({"method": method, "max_new_tokens": 40, "tree.total_tokens": 16,
                                                     "tree.depth": 4, "tree.top_k": 4, **extra})
                return Engine(target, make_drafter(method, target, cfg), cfg).generate(prompt).tokens
            ref = run("vanilla", {})
            for method, extra in STRICT.items():
                got = run(method, extra)
                out.append({"arch": arch, "prompt": p, "method": method, "equal": got == ref})
    return out


def random_7b(device: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from respec.models.hf import HFTarget

    cfg = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096,
                      attn_implementation="sdpa", tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return HFTarget(model, eos_token_ids=frozenset({2}), context_length=4096, name="random-7b (Llama-2-7B shape)")


def speed_target(spec: str, device: str):
    import torch

    from respec.models import load_target
    from respec.models.hf import HFTarget
    from respec.models.loading import default_cache_dir
    from respec.models.tiny import EOS, tiny_llama

    if spec == "auto":
        spec = "default" if (default_cache_dir() / "config.json").is_file() else "random-7b"
    if spec == "random-7b":
        return random_7b(device), spec
    if spec == "tiny":
        model = tiny_llama(seed=1, dtype=torch.float32).to(device)
        return HFTarget(model, eos_token_ids=frozenset({EOS}), context_length=256, name="tiny-llama"), spec
    return load_target(spec, device=device), spec


def speeds(target, max_new_tokens: int) -> list[dict]:
    from respec.bench import first_divergence, gap_tolerance
    from respec.config import EngineConfig, device_defaults
    from respec.runner import Runner

    runner = Runner(target)
    base = EngineConfig().with_overrides({**device_defaults(target.device.type), "max_new_tokens": max_new_tokens})
    prompts = ([runner.encode(t) for t in TEXT_PROMPTS] if runner.tokenizer is not None
               else id_prompts(min(target.vocab_size, 32000)))
    tol = gap_tolerance(str(target.dtype))
    rows = []
    for m in SPEED_METHODS:                                   # warm-up, then timed runs
        runner.engine(base.with_overrides({"method": m, "max_new_tokens": 8})).generate(prompts[0])
    refs = {}
    for m in SPEED_METHODS:
        cfg = base.with_overrides({"method": m})
        for p, ids in enumerate(prompts):
            r = runner.engine(cfg).generate(ids)
            if m == "vanilla":
                refs[p] = r
            ref = refs[p]
            div = first_divergence(ref.tokens, r.tokens)
            margins = ref.token_margins()
            gap = None if div is None or div >= len(margins) else margins[div]
            rows.append({"method": m, "prompt": p, "new_tokens": len(r.tokens), "wall_s": r.wall_time_s,
                         "tokens_per_s": r.stats.tokens_per_s, "mean_accepted": r.stats.mean_accepted_length,
                         "identical": div is None, "lossless": div is None or (gap is not None and gap <= tol),
                         "divergence_gap": gap})
    return rows


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="auto", choices=["auto", "default", "random-7b", "tiny"])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", default="gpu-check.json")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: CUDA is not available here (pass --device cpu to run the same checks on the CPU)", file=sys.stderr)
        return 2
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    report: dict = {"device": args.device, "torch": torch.__version__, "python": platform.python_version(),
                    "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None}
    import transformers
    report["transformers"] = transformers.__version__
    print(f"gpu_check on {report['gpu'] or args.device}: torch {torch.__version__}, transformers "
          f"{transformers.__version__}", flush=True)

    # 1. exactness
    t0 = time.perf_counter()
    ex = exactness(args.device)
    report["exactness"] = ex
    bad = [e for e in ex if not e["equal"]]
    print(f"\n1. exactness (tiny float64 Llama + Qwen2, {len(ex)} strict runs): "
          + ("all equal to vanilla" if not bad else f"{len(bad)} DIFFER: {bad}")
          + f" ({time.perf_counter() - t0:.1f} s)", flush=True)

    # 2. verify-cost curve
    target, spec = speed_target(args.model, args.device)
    report["speed_model"] = {"spec": spec, "name": target.name, "dtype": str(target.dtype)}
    context = min(512, target.context_length // 2)
    curve = target.verify_cost_curve(max_size=64, context=context, reps=3)
    report["verify_cost_ms"] = {str(k): round(v, 3) for k, v in curve.items()}
    report["verify_cost_context"] = context
    print(f"\n2. verify-cost curve of {target.name} ({str(target.dtype).replace('torch.', '')}), "
          f"{context} cached tokens")
    print("| tree tokens | " + " | ".join(str(n) for n in curve) + " |")
    print("|---|" + "---|" * len(curve))
    print("| ms | " + " | ".join(f"{v:.2f}" for v in curve.values()) + " |")
    print("| x one token | " + " | ".join(f"{v / curve[1]:.2f}" for v in curve.values()) + " |", flush=True)

    # 3. speeds
    rows = speeds(target, args.max_new_tokens)
    report["speeds"] = rows
    van = [r["tokens_per_s"] for r in rows if r["method"] == "vanilla"]
    vmean = sum(van) / len(van)
    print(f"\n3. tokens/s on {len(van)} prompts, {args.max_new_tokens} new tokens, device defaults (tree.auto)")
    print("| method | tokens/s | speedup | MAT | identical | lossless |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for m in SPEED_METHODS:
        part = [r for r in rows if r["method"] == m]
        tps = sum(r["tokens_per_s"] for r in part) / len(part)
        summary[m] = {"tokens_per_s": tps, "speedup": tps / vmean if vmean else None,
                      "mean_accepted": sum(r["mean_accepted"] for r in part) / len(part),
                      "identical": sum(r["identical"] for r in part) / len(part),
                      "lossless": sum(r["lossless"] for r in part) / len(part)}
        s = summary[m]
        print(f"| {m} | {tps:.1f} | {s['speedup']:.2f}x | {s['mean_accepted']:.2f} | {s['identical']:.2f} | "
              f"{s['lossless']:.2f} |")
    report["summary"] = summary
    report["ok"] = not bad
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"\n{'PASS' if report['ok'] else 'FAIL'}: report written to {args.out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
