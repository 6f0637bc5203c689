"""The one command for a lent CUDA machine: run from the repository alone, with the machine's own packages.

    python3 scripts/gpu_check.py OUT_DIR [--device cuda] [--speed-model auto|default|random-7b|tiny]
                                 [--max-new-tokens 64] [--transformers-wheel PATH.whl] [--split-devices A,B]
                                 [--prompts 3] [--time-budget-s 420] [--no-default-model]

Needs Python >= 3.10 and the packages a GPU image ships: torch, transformers >= 5, accelerate,
safetensors, tokenizers, huggingface_hub (checked first; one line says what is missing, exit 2). No
.venv, no network, no gradio. `--transformers-wheel` installs a carried wheel (`pip install --no-deps`)
into a fresh temporary folder OUTSIDE OUT_DIR and imports it ahead of the installed one.
Writes ONE file, OUT_DIR/gpu-check.json, after every part (a run cut short still leaves what it
measured), and prints a summary. Parts, each recorded with its seconds:

0. Environment: Python, torch, transformers (the guard of respec/models/compat.py: version floor,
   and the KV-cache keyword each base model and decoder layer takes), the GPUs, native bf16, the
   dtype `auto` picks.
1. Tree forward and keep, on tiny Llama and Qwen2 in float32 and float64 on the device: one masked
   forward of a branching tree gives each node the logits of decoding its root-to-node path alone;
   after keep() of a non-prefix path the next forward gives the logits of the committed text.
2. Lossless, in bfloat16 and float32: every strict method (eagle2, sam, respec-strict, respec with
   relax.budget=0) with fixed trees (16 nodes, depth 4, top-k 4: trees are verified whatever a
   head is worth) against vanilla greedy, on a GQA tiny Llama, an MHA tiny Llama and a GQA tiny
   Qwen2. The rule is the engine's (respec/lab/bench.py `gap_tolerance`): identical, or first
   diverging where vanilla's top-1/top-2 logit gap is within 0.5 (bf16) or 1e-3 (fp32).
3. The default model (SmolLM2-135M-Instruct) with its shipped EAGLE head, bf16 and fp32, when its
   cache is on this machine (else recorded as absent): the same rule, with the number of EAGLE
   steps whose tree had drafts and the tokens they had accepted (real trees, verified).
4. Two devices (when two GPUs are visible, or `--split-devices A,B`): the tiny Llama split with
   accelerate (embedding and first layer on A; the rest, the final norm and lm_head on B) in bf16
   and fp32; every method must equal vanilla on one device by the same rule.
5. Round trips per step (respec/transfer.py counts every host<->device crossing): eagle2 at the
   CUDA device defaults (60 nodes, depth 5, top-k 10, tree.auto with the depth cut; the head kept
   drafting) on the tiny Llama; at most 12 per EAGLE step.
6. The verify-cost curve of the speed model per context length: {context: {tree size: ms}} for
   1..64 tree tokens after 256 and 1,024 cached tokens (at most half the model's context). The
   speed model is the default model when its cache is here (`auto`), else a randomly initialised
   model of Llama-2-7B's shape in the auto dtype (`random-7b`).
7. Tokens/s of every method on three prompts with the device defaults (tree.auto): the engine's
   methods, SuffixDecoding where its library is installed, and transformers' own greedy and
   prompt-lookup decoding; speedup over vanilla, mean accepted length, lossless rate. Skipped if
   --time-budget-s is already spent.
Parts 6 and 7 measure; the others pass or fail. Exit status: 0 all checks pass, 1 a check failed,
2 a package is missing, the device or the wheel is unusable.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STRICT = {"eagle2": {}, "sam": {"sam.len_threshold": 2}, "respec-strict": {"trigger.theta_entropy": 20.0},
          "respec": {"relax.budget": 0, "trigger.theta_entropy": 20.0}}
FIXED_TREES = {"tree.auto": False, "tree.total_tokens": 16, "tree.depth": 4, "tree.top_k": 4, "sam.n_predicts": 16}
ENGINE_METHODS = ("vanilla", "eagle2", "sam", "respec", "respec-strict", "suffix")
PEER_METHODS = ("hf-greedy", "hf-pld")
TEXT_PROMPTS = ("List the days of the week, one per line, then list them again.",
                "Summarize in two sentences: speculative decoding drafts several tokens cheaply and verifies "
                "them with one forward pass of the large model, which keeps the output unchanged.",
                "Write a Python function that returns the n-th Fibonacci number, then explain it.")
FP32_TOL = 1e-3           # logit agreement (tree vs path, keep vs fresh prefill)
FP64_TOL = 1e-9
MAX_ROUND_TRIPS = 12      # per EAGLE step at the CUDA defaults (issue 30)
COST_CONTEXTS = (256, 1024)
#: import name -> (distribution, oldest version); None: any version
REQUIREMENTS = {"torch": ("torch", (2, 4)), "transformers": ("transformers", (5, 0)), "accelerate": ("accelerate", None),
                "safetensors": ("safetensors", None), "tokenizers": ("tokenizers", None),
                "huggingface_hub": ("huggingface_hub", None)}


def id_prompts(vocab: int) -> list[list[int]]:
    """Token-id prompts with repeats (so retrieval has matches) for models without a tokenizer."""
    base = [(7 * i + 3) % (vocab - 3) + 3 for i in range(24)]
    return [base + base[:12], [5, 6, 7, 8, 9, 10] * 6, list(range(40, 80)) + list(range(40, 60))]


# --------------------------------------------------------------------------------------------- 0.
def missing_requirements() -> list[str]:
    """What this script needs and the machine lacks ("accelerate", "transformers 4.57.0 < 5.0"), or []."""
    out = []
    if sys.version_info < (3, 10):
        out.append(f"python {platform.python_version()} < 3.10")
    for name, (dist, oldest) in REQUIREMENTS.items():
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):          # a broken install counts as missing
            found = False
        if not found:
            out.append(name)
            continue
        if oldest is None:
            continue
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue                      # importable without metadata (a carried wheel on sys.path)
        numbers = tuple(int(p) for p in version.split("+")[0].split(".")[:2] if p.isdigit())
        if numbers < oldest:
            out.append(f"{name} {version} < {'.'.join(map(str, oldest))}")
    return out


def install_wheel(wheel: str) -> str:
    """pip-install `wheel` without dependencies into a new temporary folder (never under OUT_DIR: only
    a few files come back from a lent machine) and put it first on sys.path (before transformers is
    imported). Returns the folder."""
    site = tempfile.mkdtemp(prefix="respec-wheel-")
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
           "--quiet", "--target", site, wheel]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"pip install of {wheel} failed: {(done.stderr or done.stdout).strip()[-800:]}")
    sys.path.insert(0, site)
    return site


def environment(device: str) -> dict:
    import torch
    import transformers
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaModel
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2Model

    from respec.models.compat import cache_kwarg, check_transformers
    from respec.models.devices import resolve_dtype

    env = {"torch": torch.__version__, "transformers": transformers.__version__,
           "transformers_file": transformers.__file__, "python": platform.python_version(), "device": device}
    for name in ("accelerate", "safetensors", "tokenizers", "huggingface_hub"):
        env[name] = getattr(__import__(name), "__version__", "?")
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


# --------------------------------------------------------------------------------------------- 2. 3.
def _run(target, method: str, prompt, extra: dict, max_new: int = 40, runner=None):
    from respec.config import EngineConfig
    from respec.drafters import make_drafter
    from respec.engine import Engine

    cfg = EngineConfig().with_overrides({"method": method, "max_new_tokens": max_new, **extra})
    if runner is not None:
        return runner.engine(cfg).generate(prompt)
    return Engine(target, make_drafter(method, target, cfg), cfg).generate(prompt)


def judged(ref, got, dtype: str) -> dict:
    """`got` against vanilla's `ref` by the engine's lossless rule, with the trees it verified."""
    from respec.lab.bench import first_divergence, gap_tolerance

    div = first_divergence(ref.tokens, got.tokens)
    margins = ref.token_margins()
    gap = None if div is None or div >= len(margins) else margins[div]
    trees = [s for s in got.steps if s.tree.size > 1]
    return {"equal": div is None, "ok": div is None or (gap is not None and gap <= gap_tolerance(dtype)),
            "divergence_gap": gap, "mean_accepted": got.stats.mean_accepted_length,
            "trees_verified": len(trees), "eagle_trees": sum(s.source == "eagle" for s in trees),
            "accepted_in_trees": sum(s.verdict.num_accepted for s in trees)}


def tiny_models(dtype):
    """(name, model) of the three tiny models of part 2: GQA Llama, MHA Llama, GQA Qwen2."""
    from respec.models.tiny import tiny_llama, tiny_qwen2

    return [("llama-gqa", tiny_llama(seed=1, dtype=dtype)), ("llama-mha", tiny_llama(seed=1, dtype=dtype, kv_heads=4)),
            ("qwen2-gqa", tiny_qwen2(seed=1, dtype=dtype))]


def lossless(device: str, n_prompts: int = 3) -> list[dict]:
    import torch

    from respec.models.hf import HFTarget
    from respec.models.tiny import EOS

    out = []
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).removeprefix("torch.")
        for arch, model in tiny_models(dtype):
            target = HFTarget(model.to(device), eos_token_ids=frozenset({EOS}), context_length=256, name=arch)
            for p, prompt in enumerate(id_prompts(128)[:n_prompts]):
                ref = _run(target, "vanilla", prompt, {})
                for method, extra in STRICT.items():
                    row = judged(ref, _run(target, method, prompt, {**FIXED_TREES, **extra}), name)
                    out.append({"dtype": name, "model": arch, "prompt": p, "method": method, **row})
    return out


def default_model(device: str, n_prompts: int, max_new: int) -> dict:
    """Part 3: the default model with its shipped head, bf16 and fp32, fixed trees; absent -> a note."""
    from respec.models import load_target
    from respec.models.default_model import default_cache_dir
    from respec.runner import Runner

    if not (default_cache_dir() / "config.json").is_file():
        return {"present": False, "note": f"no default model cache at {default_cache_dir()} (set RESPEC_CACHE)"}
    rows = []
    for dtype in ("bf16", "fp32"):
        runner = Runner(load_target("default", device=device, dtype=dtype))
        name = str(runner.target.dtype).removeprefix("torch.")
        for p, text in enumerate(TEXT_PROMPTS[:n_prompts]):
            ids = runner.encode(text)
            ref = _run(None, "vanilla", ids, {}, max_new, runner)
            for method in ("eagle2", "sam", "respec-strict"):
                got = _run(None, method, ids, {**FIXED_TREES, **STRICT[method]}, max_new, runner)
                rows.append({"dtype": name, "prompt": p, "method": method, "head": runner.head_info,
                             **judged(ref, got, name)})
    return {"present": True, "rows": rows,
            "eagle_trees_verified": sum(r["eagle_trees"] for r in rows),
            "eagle_tokens_accepted": sum(r["accepted_in_trees"] for r in rows if r["method"] == "eagle2")}


# --------------------------------------------------------------------------------------------- 4.
def split_devices(first: str, second: str, n_prompts: int = 3) -> list[dict]:
    import torch
    from accelerate import dispatch_model

    from respec.models.hf import HFTarget
    from respec.models.tiny import EOS, tiny_llama

    device_map = {"model.embed_tokens": first, "model.layers.0": first, "model.layers.1": second,
                  "model.norm": second, "model.rotary_emb": second, "lm_head": second}
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).removeprefix("torch.")
        one = HFTarget(tiny_llama(seed=1, dtype=dtype).to(first), eos_token_ids=frozenset({EOS}),
                       context_length=256, name="tiny-llama one device")
        split = HFTarget(dispatch_model(tiny_llama(seed=1, dtype=dtype), device_map=device_map),
                         eos_token_ids=frozenset({EOS}), context_length=256, name="tiny-llama split")
        for p, prompt in enumerate(id_prompts(128)[:n_prompts]):
            ref = _run(one, "vanilla", prompt, {})
            for method in ("vanilla", "eagle2", "sam", "respec-strict"):
                got = _run(split, method, prompt, {**FIXED_TREES, **STRICT.get(method, {})})
                rows.append({"devices": [first, second], "dtype": name, "prompt": p, "method": method,
                             **judged(ref, got, name)})
    return rows


# --------------------------------------------------------------------------------------------- 5.
def round_trips(device: str) -> dict:
    """eagle2 at the CUDA defaults on the tiny Llama (fp32), the head kept drafting (its probe and
    the cost model's verdicts set aside: a flat verify-cost curve), every step's crossings counted."""
    import torch

    from respec.config import EngineConfig, device_defaults
    from respec.drafters.eagle2 import Eagle2Drafter
    from respec.drafters.heads.eagle import random_head
    from respec.engine import Engine
    from respec.models.hf import HFTarget
    from respec.models.tiny import EOS, tiny_llama
    from respec.transfer import counting

    class Drafting(Eagle2Drafter):
        def _probe_refusal(self, cost):
            return None

    target = HFTarget(tiny_llama(seed=1, dtype=torch.float32).to(device), eos_token_ids=frozenset({EOS}),
                      context_length=256, name="tiny-llama")
    target.verify_cost_curve = lambda max_size=64, **_: {n: 1000.0 for n in (1, 2, 4, 8, 16, 32, 64, max_size)}
    cfg = EngineConfig().with_overrides({**device_defaults("cuda"), "method": "eagle2", "max_new_tokens": 40})
    engine = Engine(target, Drafting(target, random_head(target, seed=3), cfg.tree), cfg)
    stream, steps = engine.stream(id_prompts(128)[0]), []
    while True:
        with counting() as rec:
            trace = next(stream, None)
        if trace is None:
            break
        steps.append({"source": trace.source, "tree": trace.tree.size, "reads": rec.reads, "uploads": rec.uploads,
                      "round_trips": rec.round_trips, "where": rec.where})
    eagle = [s for s in steps[1:] if s["source"] == "eagle"] or [{"round_trips": None}]
    worst = max((s["round_trips"] for s in eagle if s["round_trips"] is not None), default=None)
    return {"settings": {k: v for k, v in device_defaults("cuda").items()} | {"tree": [60, 5, 10]},
            "eagle_steps": len([s for s in eagle if s["round_trips"] is not None]), "max_per_eagle_step": worst,
            "mean_per_eagle_step": (sum(s["round_trips"] for s in eagle) / len(eagle)) if worst is not None else None,
            "ok": worst is not None and worst <= MAX_ROUND_TRIPS, "steps": steps[:6]}


# --------------------------------------------------------------------------------------------- 6. 7.
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


def cost_curves(target) -> dict[str, dict[str, float]]:
    """{context: {tree size: ms}}: one curve per context length, each measured on its own."""
    out = {}
    for context in sorted({min(c, target.context_length // 2) for c in COST_CONTEXTS}):
        curve = target.verify_cost_curve(max_size=64, context=context, reps=3)
        out[str(context)] = {str(k): round(v, 3) for k, v in curve.items()}
    return out


def speeds(target, max_new_tokens: int) -> list[dict]:
    from respec.lab.bench import first_divergence, gap_tolerance, hf_generate
    from respec.config import EngineConfig, device_defaults
    from respec.drafters.suffix import suffix_library
    from respec.runner import Runner

    runner = Runner(target)
    base = EngineConfig().with_overrides({**device_defaults(target.device.type), "max_new_tokens": max_new_tokens})
    prompts = ([runner.encode(t) for t in TEXT_PROMPTS] if runner.tokenizer is not None
               else id_prompts(min(target.vocab_size, 32000)))
    tol = gap_tolerance(str(target.dtype))
    methods = [m for m in ENGINE_METHODS if m != "suffix" or suffix_library()[0] is not None]
    for m in methods:                                   # warm-up, then timed runs
        runner.engine(base.with_overrides({"method": m, "max_new_tokens": 8})).generate(prompts[0])
    rows, refs = [], {}
    for m in (*methods, *PEER_METHODS):
        for p, ids in enumerate(prompts):
            if m in PEER_METHODS:
                tokens, wall, forwards = hf_generate(runner, ids, m, max_new_tokens)
                # as respec/lab/bench.py counts a peer: the prefill's forward chose the first token
                tps, mat = len(tokens) / wall if wall else 0.0, max(0, len(tokens) - 1) / max(1, forwards - 1)
            else:
                r = runner.engine(base.with_overrides({"method": m})).generate(ids)
                tokens, wall, tps, mat = list(r.tokens), r.wall_time_s, r.stats.tokens_per_s, r.stats.mean_accepted_length
                if m == "vanilla":
                    refs[p] = r
            ref = refs[p]
            div = first_divergence(ref.tokens, tokens)
            margins = ref.token_margins()
            gap = None if div is None or div >= len(margins) else margins[div]
            rows.append({"method": m, "prompt": p, "new_tokens": len(tokens), "wall_s": wall, "tokens_per_s": tps,
                         "mean_accepted": mat, "identical": div is None,
                         "lossless": div is None or (gap is not None and gap <= tol), "divergence_gap": gap})
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
    ap.add_argument("out_dir", help="folder for gpu-check.json (created; the only file written there)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--speed-model", "--model", dest="model", default="auto",
                    choices=["auto", "default", "random-7b", "tiny"], help="the model of parts 6 and 7")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--transformers-wheel", default=None, help="a carried transformers wheel to test instead")
    ap.add_argument("--split-devices", default=None, metavar="A,B",
                    help="run part 4 on these two devices (default: cuda:0,cuda:1 when two GPUs are visible)")
    ap.add_argument("--prompts", type=int, default=3, choices=[1, 2, 3],
                    help="prompts per model in parts 2-4 (fewer: a quicker CPU smoke run)")
    ap.add_argument("--no-default-model", action="store_true", help="skip part 3 even where the model is present")
    ap.add_argument("--time-budget-s", type=float, default=420.0,
                    help="skip the speeds once this many seconds are spent (the whole run must fit 8 minutes)")
    return ap


def _start(args, report: Report) -> int | None:
    """Requirements, the wheel and the device, before anything imports transformers. An exit status
    when the run cannot go on (the report says why), else None."""
    missing = missing_requirements()
    if missing:
        report.data["missing"] = missing
        report.write()
        print(f"gpu_check: missing: {'; '.join(missing)} (needs torch >= 2.4, transformers >= 5.0, accelerate, "
              "safetensors, tokenizers, huggingface_hub)", file=sys.stderr)
        return 2
    if args.transformers_wheel:
        try:
            report.data["wheel"] = {"path": args.transformers_wheel, "site": install_wheel(args.transformers_wheel)}
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
    return None


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report(out_dir / "gpu-check.json")
    stop = _start(args, report)
    if stop is not None:
        return stop
    import torch

    env = report.part("environment", environment, args.device) or {}
    print(f"gpu_check on {', '.join(env.get('gpus') or [args.device])}: python {env.get('python')}, torch "
          f"{env.get('torch')}, transformers {env.get('transformers')} (guard "
          f"{'ok' if env.get('transformers_ok') else 'FAILED'}; cache keyword {env.get('cache_kwarg')}); "
          f"auto dtype {env.get('auto_dtype', '-')}", flush=True)
    checks = {"environment": bool(env.get("transformers_ok"))}
    rows = report.part("tree_and_keep", tree_and_keep, args.device) or []
    checks["tree_and_keep"] = bool(rows) and all(r["ok"] for r in rows)
    _say("1. tree forward and non-prefix keep", checks["tree_and_keep"], "".join(
        f"\n   {r['arch']} {r['dtype']}: tree {r['tree_max_abs_diff']:.2e}, keep {r['keep_max_abs_diff']:.2e}"
        for r in rows))
    rows = report.part("lossless", lossless, args.device, args.prompts) or []
    checks["lossless"] = _judge(rows, "2. lossless, bf16 and fp32, GQA/MHA Llama + GQA Qwen2, fixed trees")
    if not args.no_default_model:
        got = report.part("default_model", default_model, args.device, args.prompts, args.max_new_tokens) or {}
        if got.get("present"):
            checks["default_model"] = _judge(got["rows"], f"3. default model + shipped head ({got['eagle_trees_verified']} "
                                             f"EAGLE trees verified, {got['eagle_tokens_accepted']} tokens accepted)")
        else:
            print(f"\n3. default model: {got.get('note', 'not run')}", flush=True)
    pair = args.split_devices.split(",") if args.split_devices else (
        ["cuda:0", "cuda:1"] if args.device.startswith("cuda") and torch.cuda.device_count() >= 2 else None)
    if pair:
        rows = report.part("split_devices", split_devices, *pair, args.prompts) or []
        checks["split_devices"] = _judge(rows, f"4. model split over {pair}, bf16 and fp32, vs one device")
    else:
        print("\n4. several GPUs: skipped (one device visible)", flush=True)
    trips = report.part("round_trips", round_trips, args.device) or {}
    checks["round_trips"] = bool(trips.get("ok"))
    _say(f"5. round trips per EAGLE step at the CUDA defaults: at most {trips.get('max_per_eagle_step')}, mean "
         f"{trips.get('mean_per_eagle_step')} over {trips.get('eagle_steps')} steps (limit {MAX_ROUND_TRIPS})",
         checks["round_trips"])
    speed_parts(report, args)
    report.data["checks"], report.data["ok"] = checks, all(checks.values())
    report.write()
    print(f"\n{'PASS' if report.data['ok'] else 'FAIL'} in {report.elapsed():.0f} s: report written to {report.path}")
    return 0 if report.data["ok"] else 1


def _say(title: str, ok: bool, detail: str = "") -> None:
    print(f"\n{title}: {'ok' if ok else 'FAILED'}{detail}", flush=True)


def _judge(rows: list[dict], title: str) -> bool:
    bad = [r for r in rows if not r["ok"]]
    print(f"\n{title}: {len(rows)} runs, " + (f"all pass ({sum(r['equal'] for r in rows)} identical)" if rows and not bad
                                               else f"{len(bad)} FAIL: {bad[:3]}"), flush=True)
    return bool(rows) and not bad


def speed_parts(report: Report, args: argparse.Namespace) -> None:
    """Parts 6 and 7: the verify-cost curves of the speed target, then tokens/s per method (skipped
    once the time budget is spent). They measure; they decide no pass/fail."""
    got = report.part("speed_target", lambda: speed_target(args.model, args.device))
    if got is None:
        return
    target, spec = got
    report.data["speed_target"] = {"spec": spec, "name": target.name, "dtype": str(target.dtype)}
    curves = report.part("verify_cost_ms", cost_curves, target) or {}
    for context, curve in curves.items():
        print(f"\n6. verify-cost curve of {target.name} ({str(target.dtype).replace('torch.', '')}), "
              f"{context} cached tokens")
        print("| tree tokens | " + " | ".join(curve) + " |")
        print("|---|" + "---|" * len(curve))
        print("| ms | " + " | ".join(f"{v:.2f}" for v in curve.values()) + " |")
        print("| x one token | " + " | ".join(f"{v / curve['1']:.2f}" for v in curve.values()) + " |", flush=True)
    if report.elapsed() > args.time_budget_s:
        report.data["speeds_skipped"] = f"time budget of {args.time_budget_s:.0f} s spent"
        print(f"\n7. speeds skipped: {report.data['speeds_skipped']}")
    else:
        rows = report.part("speeds", speeds, target, args.max_new_tokens) or []
        report.data["summary"] = summarize(rows, args.max_new_tokens)


def summarize(rows: list[dict], max_new_tokens: int) -> dict:
    van = [r["tokens_per_s"] for r in rows if r["method"] == "vanilla"]
    if not van:
        return {}
    vmean = sum(van) / len(van)
    print(f"\n7. tokens/s on {len(van)} prompts, {max_new_tokens} new tokens, device defaults (tree.auto)")
    print("| method | tokens/s | speedup | MAT | identical | lossless |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for m in dict.fromkeys(r["method"] for r in rows):
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
