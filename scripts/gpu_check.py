"""The one command for a lent CUDA machine (no network needed; also runs on a CPU with `--device cpu`).

    python scripts/gpu_check.py OUT_DIR [--device cuda] [--model auto|default|random-7b|tiny]
                                [--max-new-tokens 64] [--transformers-wheel PATH.whl]
                                [--split-devices cuda:0,cuda:1] [--prompts 3] [--time-budget-s 420]

Writes OUT_DIR/gpu-check.json after every part (a run cut short still leaves what it measured) and
prints a summary. Parts, each recorded with its seconds:

0. Environment: torch, transformers (the guard of respec/models/compat.py: version floor, and the KV-cache
   keyword each base model and decoder layer takes), the GPUs, native bf16, and the dtype `auto` picks.
   `--transformers-wheel` first installs a carried wheel (`pip install --no-deps --target OUT_DIR/site`) and
   imports it ahead of the installed one: run the checks against the transformers a GPU image ships.
1. Tree forward and keep, on tiny Llama and Qwen2 in float32 and float64 on the device: one masked forward of
   a branching tree gives each node the logits of decoding its root-to-node path alone; after keep() of a
   non-prefix path ([0, 2, 5]) the next forward gives the logits of the committed text prefilled afresh.
2. Exactness: every strict method (eagle2, sam, respec-strict, respec with relax.budget=0) on three prompts,
   against vanilla greedy: token for token in float64; lossless in float32 (identical, or first diverging
   where vanilla's top-1/top-2 gap is within 1e-3).
3. Several GPUs (when two or more are visible, or `--split-devices A,B`): the tiny Llama split over two
   devices with accelerate (embedding and first layer on A; the rest, the final norm and lm_head on B), so the
   EAGLE head (on A) gets its features from B; eagle2/sam/respec-strict must equal vanilla on one device.
4. The verify-cost curve of the speed model: milliseconds of one target forward of 1..64 tree tokens after
   512 cached tokens, every GPU synchronised. The speed model is the default model when its cache is here
   (`auto`), else a randomly initialised model of Llama-2-7B's shape in the auto dtype (`random-7b`).
5. Tokens/s per method on three prompts with the device defaults (tree.auto), speedup over vanilla, mean
   accepted length (bonus included), lossless rate. Skipped if --time-budget-s is already spent.
Exit status: 0 all checks pass, 1 a check failed, 2 the device or the wheel is unusable.
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
import traceback
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
FP32_TOL = 1e-3           # logit agreement (tree vs path, keep vs fresh prefill) and the lossless gap rule
FP64_TOL = 1e-9


def id_prompts(vocab: int) -> list[list[int]]:
    """Token-id prompts with repeats (so retrieval has matches) for models without a tokenizer."""
    base = [(7 * i + 3) % (vocab - 3) + 3 for i in range(24)]
    return [base + base[:12], [5, 6, 7, 8, 9, 10] * 6, list(range(40, 80)) + list(range(40, 60))]


# --------------------------------------------------------------------------------------------- 0.
def install_wheel(wheel: str, out_dir: Path) -> str:
    """pip-install `wheel` without dependencies into OUT_DIR/site and put it first on sys.path (before
    transformers is imported). Returns the site folder."""
    site = out_dir / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
           "--quiet", "--target", str(site), wheel]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"pip install of {wheel} failed: {(done.stderr or done.stdout).strip()[-800:]}")
    sys.path.insert(0, str(site))
    return str(site)


def environment(device: str) -> dict:
    import torch
    import transformers
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaModel
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2Model

    from respec.models.compat import cache_kwarg, check_transformers
    from respec.models.devices import resolve_dtype

    env = {"torch": torch.__version__, "transformers": transformers.__version__,
           "transformers_file": transformers.__file__, "python": platform.python_version(), "device": device}
    try:
        check_transformers()
        env["transformers_ok"] = True
    except Exception as exc:  # noqa: BLE001 - recorded, and the run fails
        env["transformers_ok"], env["transformers_error"] = False, str(exc)
    env["cache_kwarg"] = {}
    for cls in (LlamaModel, LlamaDecoderLayer, Qwen2Model, Qwen2DecoderLayer):
        try:
            env["cache_kwarg"][cls.__name__] = cache_kwarg(cls.forward)
        except Exception as exc:  # noqa: BLE001
            env["cache_kwarg"][cls.__name__] = f"ERROR: {exc}"
            env["transformers_ok"] = False
    if device.startswith("cuda"):
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        env["capability"] = list(torch.cuda.get_device_capability(0))
        env["bf16_native"] = torch.cuda.is_bf16_supported(including_emulation=False)
        dev = torch.device(device)
        env["auto_dtype"] = {m: str(resolve_dtype("auto", dev, m)).removeprefix("torch.") for m in ("llama", "qwen2")}
    return env


# --------------------------------------------------------------------------------------------- 1.
def tree_and_keep(device: str) -> list[dict]:
    import torch

    from respec.models.hf import HFTarget
    from respec.models.tiny import EOS, tiny_llama, tiny_qwen2
    from respec.tree import DraftTree

    rows = []
    prompt = id_prompts(128)[0]
    #  root(0) -> a(1) -> c(3), a -> d(4); root -> b(2) -> e(5): keep [0, 2, 5] is not a prefix of the block
    tree = DraftTree.from_parents([11, 21, 22, 31, 32, 33], [-1, 0, 0, 1, 1, 2], "eagle")
    for arch, build in (("llama", tiny_llama), ("qwen2", tiny_qwen2)):
        for dtype, tol in ((torch.float32, FP32_TOL), (torch.float64, FP64_TOL)):
            target = HFTarget(build(seed=2, dtype=dtype).to(device), eos_token_ids=frozenset({EOS}),
                              context_length=256, name=f"tiny-{arch}")
            # references: each node's path decoded as plain text (prefill = the causal forward)
            ref = torch.stack([target.prefill(prompt + [tree.tokens[j] for j in tree.path_to(i)]).logits[-1]
                               for i in range(tree.size)])                                     # [n, V]
            kept = [0, 2, 5]
            nxt = 40
            after_keep = target.prefill(prompt + [tree.tokens[j] for j in kept] + [nxt]).logits[-1]   # [V]
            target.prefill(prompt)
            out = target.forward_tree(tree).logits                                             # [n, V]
            tree_diff = float((out - ref).abs().max())
            target.keep(kept)
            kv_ok = target.kv_len == len(prompt) + len(kept)
            got = target.forward_tree(DraftTree.root_only(nxt)).logits[-1]
            target.keep([0])
            keep_diff = float((got - after_keep).abs().max())
            rows.append({"arch": arch, "dtype": str(dtype).removeprefix("torch."), "tree_max_abs_diff": tree_diff,
                         "keep_max_abs_diff": keep_diff, "kv_len_ok": kv_ok,
                         "ok": kv_ok and tree_diff <= tol and keep_diff <= tol
                         and bool((out.argmax(-1) == ref.argmax(-1)).all())})
    return rows


# --------------------------------------------------------------------------------------------- 2.
def _run(target, method: str, prompt, extra: dict, max_new: int = 40):
    from respec.config import EngineConfig
    from respec.drafters import make_drafter
    from respec.engine import Engine

    cfg = EngineConfig().with_overrides({"method": method, "max_new_tokens": max_new, "tree.total_tokens": 16,
                                         "tree.depth": 4, "tree.top_k": 4, **extra})
    return Engine(target, make_drafter(method, target, cfg), cfg).generate(prompt)


def exactness(device: str, n_prompts: int = 3) -> list[dict]:
    import torch

    from respec.bench import first_divergence
    from respec.models.hf import HFTarget
    from respec.models.tiny import EOS, tiny_llama, tiny_qwen2

    out = []
    for dtype in (torch.float64, torch.float32):
        for arch, build in (("llama", tiny_llama), ("qwen2", tiny_qwen2)):
            model = build(seed=1, dtype=dtype).to(device)
            target = HFTarget(model, eos_token_ids=frozenset({EOS}), context_length=256, name=f"tiny-{arch}")
            for p, prompt in enumerate(id_prompts(128)[:n_prompts]):
                ref = _run(target, "vanilla", prompt, {})
                margins = ref.token_margins()
                for method, extra in STRICT.items():
                    got = _run(target, method, prompt, extra)
                    div = first_divergence(ref.tokens, got.tokens)
                    gap = None if div is None or div >= len(margins) else margins[div]
                    exact = dtype == torch.float64
                    ok = div is None or (not exact and gap is not None and gap <= FP32_TOL)
                    out.append({"dtype": str(dtype).removeprefix("torch."), "arch": arch, "prompt": p,
                                "method": method, "equal": div is None, "ok": ok, "divergence_gap": gap,
                                "mean_accepted": got.stats.mean_accepted_length})
    return out


# --------------------------------------------------------------------------------------------- 3.
def split_devices(first: str, second: str, n_prompts: int = 3) -> list[dict]:
    import torch
    from accelerate import dispatch_model

    from respec.models.hf import HFTarget
    from respec.models.tiny import EOS, tiny_llama

    one = HFTarget(tiny_llama(seed=1, dtype=torch.float64).to(first), eos_token_ids=frozenset({EOS}),
                   context_length=256, name="tiny-llama one device")
    model = tiny_llama(seed=1, dtype=torch.float64)
    device_map = {"model.embed_tokens": first, "model.layers.0": first, "model.layers.1": second,
                  "model.norm": second, "model.rotary_emb": second, "lm_head": second}
    split = HFTarget(dispatch_model(model, device_map=device_map), eos_token_ids=frozenset({EOS}),
                     context_length=256, name="tiny-llama split")
    rows = []
    for p, prompt in enumerate(id_prompts(128)[:n_prompts]):
        ref = _run(one, "vanilla", prompt, {}).tokens
        for method in ("vanilla", "eagle2", "sam", "respec-strict"):
            got = _run(split, method, prompt, STRICT.get(method, {})).tokens
            rows.append({"devices": [first, second], "prompt": p, "method": method, "ok": got == ref})
    return rows


# --------------------------------------------------------------------------------------------- 4. 5.
def random_7b(device: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from respec.models.hf import HFTarget
    from respec.models.devices import resolve_dtype

    cfg = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=32, vocab_size=32000, max_position_embeddings=4096,
                      attn_implementation="sdpa", tie_word_embeddings=False)
    dtype = resolve_dtype("auto", torch.device(device), "llama")
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    return HFTarget(model, eos_token_ids=frozenset({2}), context_length=4096, name="random-7b (Llama-2-7B shape)")


def speed_target(spec: str, device: str):
    import torch

    from respec.models import load_target
    from respec.models.hf import HFTarget
    from respec.models.default_model import default_cache_dir
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


# --------------------------------------------------------------------------------------------- main
class Report:
    """The JSON report, rewritten after every part."""

    def __init__(self, path: Path) -> None:
        self.path, self.data, self.t0 = path, {"ok": None, "parts": {}}, time.perf_counter()

    def part(self, name: str, fn, *args):
        """Run one part; record its result (or its error) and seconds; write the file. Returns the result."""
        t = time.perf_counter()
        try:
            result, error = fn(*args), None
        except Exception as exc:  # noqa: BLE001 - a part that crashes is a failed check, not a lost report
            result, error = None, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
        self.data["parts"][name] = {"seconds": round(time.perf_counter() - t, 2), "error": error}
        self.data[name] = result
        self.write()
        if error:
            print(f"\n{name}: ERROR {error}", flush=True)
        return result

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def write(self) -> None:
        self.data["elapsed_s"] = round(self.elapsed(), 2)
        self.path.write_text(json.dumps(self.data, indent=1, default=str))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", help="folder for gpu-check.json (created)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="auto", choices=["auto", "default", "random-7b", "tiny"])
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--transformers-wheel", default=None, help="a carried transformers wheel to test instead")
    ap.add_argument("--split-devices", default=None, metavar="A,B",
                    help="run part 3 on these two devices (default: cuda:0,cuda:1 when two GPUs are visible)")
    ap.add_argument("--prompts", type=int, default=3, choices=[1, 2, 3],
                    help="id prompts per model in parts 2 and 3 (fewer: a quicker CPU smoke run)")
    ap.add_argument("--time-budget-s", type=float, default=420.0,
                    help="skip the speed part once this many seconds are spent (the whole run must fit 8 minutes)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report(out_dir / "gpu-check.json")
    if args.transformers_wheel:                          # before anything imports transformers
        try:
            report.data["wheel"] = {"path": args.transformers_wheel,
                                    "site": install_wheel(args.transformers_wheel, out_dir)}
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
            report.data["wheel"] = {"path": args.transformers_wheel, "error": str(exc)}
            report.write()
            print(f"error: {exc}", file=sys.stderr)
            return 2
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: CUDA is not available here (pass --device cpu to run the same checks on the CPU)", file=sys.stderr)
        return 2
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    # 0.
    env = report.part("environment", environment, args.device) or {}
    print(f"gpu_check on {', '.join(env.get('gpus') or [args.device])}: torch {env.get('torch')}, transformers "
          f"{env.get('transformers')} (guard {'ok' if env.get('transformers_ok') else 'FAILED'}; cache keyword "
          f"{env.get('cache_kwarg')}); auto dtype {env.get('auto_dtype', '-')}", flush=True)
    checks = [bool(env.get("transformers_ok"))]

    # 1.
    rows = report.part("tree_and_keep", tree_and_keep, args.device) or []
    checks.append(bool(rows) and all(r["ok"] for r in rows))
    print("\n1. tree forward and non-prefix keep: " + ("ok" if checks[-1] else "FAILED") + "".join(
        f"\n   {r['arch']} {r['dtype']}: tree {r['tree_max_abs_diff']:.2e}, keep {r['keep_max_abs_diff']:.2e}"
        for r in rows), flush=True)

    # 2.
    ex = report.part("exactness", exactness, args.device, args.prompts) or []
    bad = [e for e in ex if not e["ok"]]
    checks.append(bool(ex) and not bad)
    print(f"\n2. exactness ({len(ex)} strict runs, tiny Llama + Qwen2, float64 exact / float32 lossless): "
          + ("all pass" if ex and not bad else f"{len(bad)} FAIL: {bad[:4]}"), flush=True)

    # 3.
    pair = args.split_devices.split(",") if args.split_devices else (
        ["cuda:0", "cuda:1"] if args.device.startswith("cuda") and torch.cuda.device_count() >= 2 else None)
    if pair:
        split = report.part("split_devices", split_devices, *pair, args.prompts) or []
        checks.append(bool(split) and all(r["ok"] for r in split))
        print(f"\n3. model split over {pair}: " + ("all equal to one device" if checks[-1] else "FAILED"), flush=True)
    else:
        print("\n3. several GPUs: skipped (one device visible)", flush=True)

    # 4. and 5.
    speed_parts(report, args)
    report.data["ok"] = all(checks)
    report.write()
    print(f"\n{'PASS' if report.data['ok'] else 'FAIL'} in {report.elapsed():.0f} s: report written to {report.path}")
    return 0 if report.data["ok"] else 1


def speed_parts(report: Report, args: argparse.Namespace) -> None:
    """Parts 4 and 5: the verify-cost curve of the speed target, then tokens/s per method (skipped once the
    time budget is spent). Results go into `report`; these parts decide no pass/fail."""
    got = report.part("speed_target", lambda: speed_target(args.model, args.device))
    if got is None:
        return
    target, spec = got
    report.data["speed_target"] = {"spec": spec, "name": target.name, "dtype": str(target.dtype)}
    context = min(512, target.context_length // 2)
    curve = report.part("verify_cost_ms", lambda: {
        str(k): round(v, 3) for k, v in target.verify_cost_curve(max_size=64, context=context, reps=3).items()})
    report.data["verify_cost_context"] = context
    if curve:
        print(f"\n4. verify-cost curve of {target.name} ({str(target.dtype).replace('torch.', '')}), "
              f"{context} cached tokens")
        print("| tree tokens | " + " | ".join(curve) + " |")
        print("|---|" + "---|" * len(curve))
        print("| ms | " + " | ".join(f"{v:.2f}" for v in curve.values()) + " |")
        print("| x one token | " + " | ".join(f"{v / curve['1']:.2f}" for v in curve.values()) + " |", flush=True)
    # 5.
    if report.elapsed() > args.time_budget_s:
        report.data["speeds_skipped"] = f"time budget of {args.time_budget_s:.0f} s spent"
        print(f"\n5. speeds skipped: {report.data['speeds_skipped']}")
    else:
        rows = report.part("speeds", speeds, target, args.max_new_tokens) or []
        report.data["summary"] = summarize(rows, args.max_new_tokens)


def summarize(rows: list[dict], max_new_tokens: int) -> dict:
    van = [r["tokens_per_s"] for r in rows if r["method"] == "vanilla"]
    if not van:
        return {}
    vmean = sum(van) / len(van)
    print(f"\n5. tokens/s on {len(van)} prompts, {max_new_tokens} new tokens, device defaults (tree.auto)")
    print("| method | tokens/s | speedup | MAT | identical | lossless |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for m in SPEED_METHODS:
        part = [r for r in rows if r["method"] == m]
        tps = sum(r["tokens_per_s"] for r in part) / len(part)
        s = summary[m] = {"tokens_per_s": tps, "speedup": tps / vmean if vmean else None,
                          "mean_accepted": sum(r["mean_accepted"] for r in part) / len(part),
                          "identical": sum(r["identical"] for r in part) / len(part),
                          "lossless": sum(r["lossless"] for r in part) / len(part)}
        print(f"| {m} | {tps:.1f} | {s['speedup']:.2f}x | {s['mean_accepted']:.2f} | {s['identical']:.2f} | "
              f"{s['lossless']:.2f} |")
    return summary


if __name__ == "__main__":
    sys.exit(main())
