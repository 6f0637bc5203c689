"""EAGLE head training (ALGORITHMS.md §4.7), batched and cache-free, resumable.

Alignment: a sequence x_0..x_{n-1} has target features f_0..f_{n-1} (final-norm hidden states;
lm_head(f_t) predicts x_{t+1}). Head position t takes the pair (f_t + noise, x_{t+1}) and predicts
f̂_{t+1}; head positions are 0..n-2, exactly as the inference head (EagleHead.forward) numbers them.
The loss covers predicted features f̂_j with j >= example.start (j >= 1):
    L = v_w * SmoothL1(f̂_j, f_j)  (mean over hidden dims)  +  p_w * CE(softmax(lm_head(f_j)), log_softmax(lm_head(f̂_j)))
averaged over covered positions. Top-1 = argmax lm_head(f̂_j) == argmax lm_head(f_j), i.e. the
target's own next token (what greedy verification accepts).

The head and its batched training forward live in `respec.train.head`; batches, target features
and their cache in `respec.train.features`.

Speed options (CPU training is dominated by two costs, measured on the default model: the target
forward that makes features, and the 49k-vocab lm_head in the soft cross-entropy):
- `cache_features`: compute every example's features once, keep them in memory in the target's
  dtype, and train from them (`FeatureCache`; `feature_store` keeps them in a safetensors file).
- `draft_vocab = N > 0`: the soft cross-entropy (and the running train top-1) are computed over the
  N token ids that most often are the target's next token in the training data (a fixed sampled
  softmax; the target's distribution is renormalised over them), and the saved head carries them
  as its draft vocabulary (`d2t`, EAGLE-3's convention): it drafts only those ids, through the
  matching rows of the shared lm_head, which makes each head step cheaper. Verification is
  unchanged (lossless). Validation top-1 is always over the full vocabulary.

Optimiser: AdamW (betas 0.9/0.95), `clip_grad_value_`, linear warm-up then linear decay to
`min_lr_ratio` at `steps`. The head trains in float32 (float64 for float64 targets) and is saved in
the published format (config.json + model.safetensors) via `save_eagle_head`.

Out dir (required: nothing is written into the repository by default): `checkpoint.pt` (head +
optimizer + step + RNG, written atomically every `save_every` steps and at the end),
`training_log.jsonl` (one JSON line per evaluation), `train_config.json`, and the final head files.
`resume=True` continues from the checkpoint's step (to a possibly larger `steps`).

Publishing (`publish=DIR`, e.g. the shipped head's directory in the repository): whenever a
validation pass beats the best validation top-1 recorded there for the same validation examples,
the head is written there (respec/train/publish.py), so a run resumed on another machine
(`--init-from DIR --publish DIR`) replaces the head only by a better one.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from respec._io import atomic_path, atomic_write_text
from respec.drafters.heads.eagle import LMHead
from respec.drafters.heads.checkpoint import save_eagle_head
from respec.errors import ConfigError, RespecError
from respec.train.data import Example, is_validation, target_slug
from respec.train.features import FeatureCache, collate, frequent_next_tokens, target_features
from respec.train.head import (AUTOCAST_MODES, head_forward, head_unroll, initial_head, make_head, train_autocast,
                               train_dtype, ttt_mask)
from respec.train.publish import chain_score, data_summary, publish_head, published_score, val_fingerprint

__all__ = ["CHECKPOINT", "LOG", "FeatureCache", "TrainConfig", "batch_loss", "check_out_dir", "collate", "evaluate",
           "frequent_next_tokens", "head_forward", "head_unroll", "lr_at", "make_head", "split", "target_features",
           "train_dtype", "train_eagle", "ttt_mask"]

CHECKPOINT = "checkpoint.pt"
LOG = "training_log.jsonl"


@dataclass
class TrainConfig:
    steps: int = 2000
    batch_size: int = 4
    max_len: int = 512
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup: int = 100
    min_lr_ratio: float = 0.1
    grad_clip: float = 0.5
    noise: float = 0.2                 # uniform noise U(-noise/2, noise/2) on input features
    v_weight: float = 1.0
    p_weight: float = 0.1
    val_fraction: float = 0.05
    val_max_examples: int = 64
    eval_every: int = 500
    save_every: int = 200
    seed: int = 0
    init_from_last_layer: bool = False
    init_from: str | None = None       # a saved head (published format) to start from: fine-tuning
    cache_features: bool = False
    feature_store: str | None = None   # safetensors file the feature cache is read from and written to
    draft_vocab: int = 0               # 0 = full vocabulary in the cross-entropy
    ttt_depth: int = 1                 # training-time test: unroll the head this many draft depths
    ttt_decay: float = 0.8             # loss weight of unrolled depth d (0-based) is ttt_decay ** d
    arch: str = "eagle"                # "eagle" (EAGLE-1/2 head) | "eagle3" (fused features, own lm_head)
    head_intermediate: int = 0         # the head's MLP width; 0 = the target's (a fresh head only)
    autocast: str = "off"              # the step's matmuls: "off" (float32), "bf16", "auto" (bf16 where the target is)

    def validate(self) -> "TrainConfig":
        ints = {"steps": 1, "batch_size": 1, "max_len": 4, "warmup": 0, "val_max_examples": 1,
                "eval_every": 1, "save_every": 1, "draft_vocab": 0, "ttt_depth": 1, "head_intermediate": 0}
        for name, low in ints.items():
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ConfigError(f"train setting {name} must be an integer >= {low}, got {v!r}")
        floats = {"lr": (0.0, 1.0, False), "weight_decay": (0.0, 10.0, True), "min_lr_ratio": (0.0, 1.0, True),
                  "grad_clip": (0.0, 1e6, False), "noise": (0.0, 100.0, True), "v_weight": (0.0, 1e6, True),
                  "p_weight": (0.0, 1e6, True), "val_fraction": (0.0, 0.5, True), "ttt_decay": (0.0, 1.0, False)}
        for name, (lo, hi, lo_ok) in floats.items():
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) \
                    or v > hi or v < lo or (v == lo and not lo_ok):
                raise ConfigError(f"train setting {name} must be a number in {'[' if lo_ok else '('}{lo}, {hi}], got {v!r}")
        if self.v_weight == 0 and self.p_weight == 0:
            raise ConfigError("v_weight and p_weight cannot both be 0")
        if self.ttt_depth > 8:
            raise ConfigError(f"train setting ttt_depth must be at most 8, got {self.ttt_depth}")
        if self.init_from is not None and self.init_from_last_layer:
            raise ConfigError("init_from and init_from_last_layer exclude each other")
        if self.autocast not in AUTOCAST_MODES:
            raise ConfigError(f"train setting autocast must be one of {', '.join(AUTOCAST_MODES)}, got {self.autocast!r}")
        if self.arch not in ("eagle", "eagle3"):
            raise ConfigError(f"train setting arch must be 'eagle' or 'eagle3', got {self.arch!r}")
        if self.head_intermediate and (self.init_from_last_layer or self.init_from is not None):
            raise ConfigError("head_intermediate shapes a fresh head; init_from and init_from_last_layer keep "
                              "the width they start from")
        if self.arch == "eagle3" and self.init_from_last_layer:
            raise ConfigError("an EAGLE-3 head cannot start from the target's last layer (its attention is 2 x wider)")
        return self


def batch_loss(head, target, lm: LMHead, ids: torch.Tensor, mask: torch.Tensor, cfg: TrainConfig,
               noise: bool, generator: torch.Generator | None = None, feats: torch.Tensor | None = None,
               full: LMHead | None = None) -> dict:
    """Loss on one batch; `feats` [B, T, F] are cached target features of `ids` (computed if None;
    F = H, or (1 + 3) x H for an EAGLE-3 head: `target_features`), `lm` may be a vocabulary subset
    (LMHead.subset) for the cross-entropy and top-1. An EAGLE-3 head is scored by its own logits
    (over its draft vocabulary, which `lm` must then cover row for row) and has no feature loss;
    with `full` (the whole output layer) its top-1 is checked against the target's arg-max over
    every id. With cfg.ttt_depth > 1 the loss is the ttt_decay**d-weighted mean over unrolled depths d
    (`head_unroll`); vloss/ploss/correct/count describe depth 0, `depth_correct`/`depth_count`
    every depth."""
    dtype = lm.weight.dtype
    dev = target.device
    mask = mask.to(dev)
    eagle3 = head.feature_layers is not None
    if feats is None:
        feats = target_features(target, ids, head.feature_layers)
    feats = feats.to(device=dev, dtype=dtype).clone()                   # [B, T, F]
    final, inputs = feats[..., :target.hidden_size], feats[..., target.hidden_size:] if eagle3 else feats
    emb = target.embed(ids[:, 1:].to(dev)).detach().to(dtype)
    inp = inputs[:, :-1]
    if noise and cfg.noise > 0:
        u = torch.rand(inp.shape, generator=generator, dtype=dtype).to(dev)
        inp = inp + (u - 0.5) * cfg.noise
    preds = head_unroll(head, emb, inp, cfg.ttt_depth)                  # each [B, T-1, H]
    ft_all = final[:, 1:][mask]                                          # [N, H] covered targets
    pos = torch.arange(mask.shape[1], device=dev).expand_as(mask)[mask]  # [N] their positions
    if ft_all.shape[0]:
        with torch.no_grad():                                            # soft labels, shared by every depth
            t_logits_all = lm(ft_all)
            t_prob_all = torch.softmax(t_logits_all, -1)
            t_top_all = (full(ft_all) if eagle3 and full is not None else t_logits_all).argmax(-1)
    total, weights = None, 0.0
    res = {"depth_correct": [], "depth_count": []}
    for d, pred in enumerate(preds):
        keep = pos >= d                      # depth d at position t needs t >= d (a real chain start)
        fh, ft = pred[mask][keep], ft_all[keep]                          # [N_d, H]
        n = int(fh.shape[0])
        if n == 0:
            loss_d, vloss, ploss, correct = pred.sum() * 0.0, 0.0, 0.0, 0
        else:
            h_logits = head.draft_logits(target, fh) if eagle3 else lm(fh)
            ploss_t = -(t_prob_all[keep] * torch.log_softmax(h_logits, -1)).sum(-1).mean()
            if eagle3:                       # its output is no target feature: token loss only
                vloss_t, loss_d = 0.0, ploss_t
            else:
                vloss_t = F.smooth_l1_loss(fh, ft, reduction="none").mean(-1).mean()
                loss_d = cfg.v_weight * vloss_t + cfg.p_weight * ploss_t
            vloss, ploss = float(vloss_t) if eagle3 else float(vloss_t.detach()), float(ploss_t.detach())
            top = h_logits.detach().argmax(-1)
            if eagle3 and full is not None and head.draft_vocab is not None:
                top = head.draft_vocab.to(top.device)[top]                  # draft index -> target id
            correct = int((top == t_top_all[keep]).sum())
        w = cfg.ttt_decay ** d
        total = loss_d * w if total is None else total + loss_d * w
        weights += w
        res["depth_correct"].append(correct)
        res["depth_count"].append(n)
        if d == 0:
            res.update({"vloss": vloss, "ploss": ploss, "correct": correct, "count": n})
    res["loss"] = total / weights
    return res


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate for optimizer step `step` (0-based)."""
    if cfg.warmup and step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup)
    frac = min(1.0, (step - cfg.warmup) / span)
    return cfg.lr * (1.0 - (1.0 - cfg.min_lr_ratio) * frac)


def split(examples: Sequence[Example], val_fraction: float, val_max: int) -> tuple[list[Example], list[Example]]:
    train, val = [], []
    for e in examples:
        (val if is_validation(e.key, val_fraction) else train).append(e)
    if not train and val:                       # tiny data sets: never train on nothing
        train, val = val[len(val) // 2:], val[:len(val) // 2]
    return train, val[:val_max]


@torch.no_grad()
def evaluate(head, target, lm: LMHead, examples: Sequence[Example], cfg: TrainConfig,
             cache: FeatureCache | None = None, full: LMHead | None = None) -> dict:
    was = head.training
    head.eval()
    tot = {"loss": 0.0, "vloss": 0.0, "ploss": 0.0, "correct": 0, "count": 0}
    dc = [0] * cfg.ttt_depth
    dn = [0] * cfg.ttt_depth
    for i in range(0, len(examples), cfg.batch_size):
        chunk = examples[i:i + cfg.batch_size]
        ids, mask = collate(chunk, cfg.max_len)
        feats = cache.batch(chunk, ids.shape[1]) if cache is not None else None
        r = batch_loss(head, target, lm, ids, mask, cfg, noise=False, feats=feats, full=full)
        c = r["count"]
        tot["loss"] += float(r["loss"]) * c
        tot["vloss"] += r["vloss"] * c
        tot["ploss"] += r["ploss"] * c
        tot["correct"] += r["correct"]
        tot["count"] += c
        for d in range(1, cfg.ttt_depth):
            dc[d] += r["depth_correct"][d]
            dn[d] += r["depth_count"][d]
    head.train(was)
    c = max(1, tot["count"])
    out = {"loss": tot["loss"] / c, "vloss": tot["vloss"] / c, "ploss": tot["ploss"] / c,
           "top1": tot["correct"] / c, "tokens": tot["count"]}
    for d in range(1, cfg.ttt_depth):      # top-1 of the d-th unrolled step (its own features as input)
        out[f"top1_depth{d + 1}"] = dc[d] / max(1, dn[d])
    return out


def check_out_dir(out: Path, resume: bool, checkpoint: bool = True) -> None:
    """RespecError unless `out` can take this run: a directory (or nothing yet) and, with `checkpoint`,
    holding a checkpoint exactly when `resume` asks to continue one."""
    if out.exists() and not out.is_dir():
        raise RespecError(f"--out {out} exists and is not a directory")
    if not checkpoint:
        return
    if resume and not (out / CHECKPOINT).is_file():
        raise RespecError(f"cannot resume: no {CHECKPOINT} in {out}")
    if not resume and (out / CHECKPOINT).is_file():
        raise RespecError(f"{out} already holds a training checkpoint; pass --resume to continue it "
                          f"or choose another --out")


def _epoch_order(lengths: Sequence[int], batch_size: int, seed: int, epoch: int, bucket: int = 64) -> list[int]:
    """Example indices for one epoch, read `batch_size` at a time: a seeded shuffle, then within each
    run of `bucket` batches the examples are sorted by length and the batches shuffled again, so a
    batch holds sequences of similar length (little padding when short windows and long-prompt
    responses mix) while the epoch stays a random permutation of all examples."""
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    span = batch_size * bucket
    out: list[int] = []
    for i in range(0, len(order), span):
        run = sorted(order[i:i + span], key=lambda j: lengths[j])
        batches = [run[k:k + batch_size] for k in range(0, len(run), batch_size)]
        rng.shuffle(batches)
        out += [j for b in batches for j in b]
    return out


# ------------------------------------------------------------------------------------ the run
def _zero_sums() -> dict[str, float]:
    return {"loss": 0.0, "vloss": 0.0, "ploss": 0.0, "correct": 0, "count": 0, "batches": 0}


@dataclass
class _Run:
    """One training run: the frozen target, the head and its optimiser, the data, and what the loop
    advances (step, epoch, position in the epoch's order, the noise RNG, running sums since the last
    log record). The checkpoint saves the loop's part with the head and optimiser."""
    target: Any
    head: torch.nn.Module
    params: list[torch.nn.Parameter]        # the head's trainable parameters (gradient clipping)
    opt: torch.optim.Optimizer
    gen: torch.Generator                    # the feature-noise RNG, saved in the checkpoint
    lm: LMHead                              # full vocabulary: validation top-1
    lm_train: LMHead                        # the draft vocabulary's rows with cfg.draft_vocab, else `lm`
    cfg: TrainConfig
    slug: str
    out: Path
    train: list[Example]
    val: list[Example]
    log: Callable[[str], None]
    cache: FeatureCache | None = None
    step: int = 0
    epoch: int = 0
    pos: int = 0
    sums: dict = field(default_factory=_zero_sums)
    t0: float = 0.0                         # perf_counter at the start of training (log's elapsed_s)
    publish: Path | None = None             # where a head that beats the best chain score so far is written
    data: dict = field(default_factory=dict)  # what the run trains on, for training.json (data_summary)
    best_score: float = -1.0                # the best validation chain_score published so far (same val set)


def _usable_split(examples: Sequence[Example], cfg: TrainConfig) -> tuple[list[Example], list[Example]]:
    """Train and validation examples, without those that hold nothing to learn within max_len."""
    examples = [e for e in examples if len(e.ids) >= 2 and max(e.start, 1) < min(len(e.ids), cfg.max_len)]
    if not examples:
        raise RespecError("no training data: every example is empty or shorter than 2 tokens")
    return split(examples, cfg.val_fraction, cfg.val_max_examples)


def _load_checkpoint(path: Path, slug: str, cfg: TrainConfig, log) -> tuple[dict, TrainConfig]:
    """The checkpoint to resume and the run's config: the saved one, with `cfg`'s length, cadence
    and speed options (they do not change what is learned, only how fast)."""
    state = torch.load(path, map_location="cpu", weights_only=False)
    if state.get("target") != slug:
        raise RespecError(f"checkpoint in {path.parent} was trained for {state.get('target')!r}, not {slug!r}")
    saved = TrainConfig(**state["config"])
    cfg = dataclasses.replace(saved, steps=cfg.steps, eval_every=cfg.eval_every,
                              save_every=cfg.save_every, cache_features=cfg.cache_features,
                              feature_store=cfg.feature_store, draft_vocab=cfg.draft_vocab,
                              autocast=cfg.autocast).validate()
    if state["step"] >= cfg.steps:
        log(f"checkpoint is already at step {state['step']} >= --steps {cfg.steps}; writing the head only")
    return state, cfg


def _start_run(target, cfg: TrainConfig, state: dict | None, data: tuple[list[Example], list[Example]],
               slug: str, out: Path, log, progress: bool) -> _Run:
    """Head, optimiser, noise RNG, vocabulary and feature cache of a new run (`state` None) or of
    the checkpoint `state` resumes; `data` is (train, val)."""
    train, val = data
    vocab = frequent_next_tokens(train, cfg.draft_vocab, cfg.max_len) if cfg.draft_vocab else None
    head = initial_head(target, cfg, state, log, draft_vocab=vocab)
    if head.feature_layers is not None and cfg.init_from and head.draft_vocab is not None:
        vocab = head.draft_vocab                # a saved EAGLE-3 head's lm_head rows fix its vocabulary
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    lm = LMHead.of(target, train_dtype(target))
    run = _Run(target, head, params, opt, gen, lm, lm, cfg, slug, out, train, val, log)
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        run.step, run.epoch, run.pos = state["step"], state["epoch"], state["pos"]
        gen.set_state(state["noise_rng"])
    if vocab is not None:
        run.lm_train = lm.subset(vocab)
        head.draft_vocab = vocab                # saved as d2t: the head drafts over these ids only
        log(f"cross-entropy and drafting over the {len(vocab)} most frequent next tokens of the training data")
    if cfg.cache_features and run.step < cfg.steps:
        store = Path(cfg.feature_store) if cfg.feature_store else None
        run.cache = FeatureCache(target, train + val, cfg.max_len, progress=progress, store=store,
                                 layers=head.feature_layers)
    return run


def _write_train_config(run: _Run) -> None:
    run.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run.out / "train_config.json", json.dumps(
        {**dataclasses.asdict(run.cfg), "target": run.slug, "train_examples": len(run.train),
         "val_examples": len(run.val), "train_tokens": sum(len(e.ids) for e in run.train)}, indent=2))


def _save_checkpoint(run: _Run) -> None:
    with atomic_path(run.out / CHECKPOINT) as tmp:
        torch.save({"step": run.step, "epoch": run.epoch, "pos": run.pos, "head": run.head.state_dict(),
                    "optimizer": run.opt.state_dict(), "config": dataclasses.asdict(run.cfg), "target": run.slug,
                    "noise_rng": run.gen.get_state()}, tmp)


def _record(run: _Run, event: str) -> dict:
    """One training-log record: the running train metrics since the last record (then reset) and a
    validation pass; appended to the log file and reported through `run.log`."""
    s, c, cfg = run.sums, run.sums["count"], run.cfg
    rec = {"event": event, "step": run.step, "epoch": run.epoch, "lr": lr_at(max(run.step - 1, 0), cfg),
           "train_loss": s["loss"] / s["batches"] if s["batches"] else None,
           "train_vloss": s["vloss"] / c if c else None, "train_ploss": s["ploss"] / c if c else None,
           "train_top1": s["correct"] / c if c else None, "train_tokens": c}
    eagle3 = run.head.feature_layers is not None     # scored over its own vocabulary, top-1 over all ids
    v = evaluate(run.head, run.target, run.lm_train if eagle3 else run.lm, run.val, cfg, run.cache,
                 full=run.lm if eagle3 else None) if run.val else {}
    rec.update({f"val_{k}": x for k, x in v.items()})
    rec["elapsed_s"] = round(time.perf_counter() - run.t0, 2)
    with open(run.out / LOG, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(rec) + "\n")
    run.sums = _zero_sums()
    if run.publish is not None and v and run.step > 0 and chain_score(rec, cfg.ttt_depth) > run.best_score:
        _publish(run, rec)
    run.log(f"[{event}] step {run.step} epoch {run.epoch}: "
            + (f"train loss {rec['train_loss']:.4f} top1 {rec['train_top1']:.3f}" if c else "untrained")
            + (f" | val loss {rec['val_loss']:.4f} top1 {rec['val_top1']:.3f} ({rec['val_tokens']} tok)" if v else "")
            + "".join(f" depth{d + 1} {rec[f'val_top1_depth{d + 1}']:.3f}" for d in range(1, cfg.ttt_depth) if v))
    return rec


def _publish(run: _Run, rec: dict) -> None:
    """Write the head and its training.json into run.publish (respec/train/publish.py)."""
    publish_head(run.head, run.publish, {
        "step": run.step, "epoch": run.epoch, "val_fingerprint": val_fingerprint(run.val, run.cfg.max_len),
        "val_examples": len(run.val), **{k: rec[k] for k in rec if k.startswith("val_")},
        "score_depth": run.cfg.ttt_depth, "init_from": run.cfg.init_from, "data": run.data})
    run.best_score = chain_score(rec, run.cfg.ttt_depth)
    run.log(f"published the head to {run.publish} (val top-1 {rec['val_top1']:.4f}, chain score "
            f"{run.best_score:.4f} at step {run.step})")


def _train_step(run: _Run, batch: list[Example]) -> dict:
    """One optimiser step on `batch` (noisy input features, clipped gradients, the step's learning
    rate); its metrics join the running sums. Returns `batch_loss`'s result."""
    cfg = run.cfg
    ids, mask = collate(batch, cfg.max_len)
    for g in run.opt.param_groups:
        g["lr"] = lr_at(run.step, cfg)
    feats = run.cache.batch(batch, ids.shape[1]) if run.cache is not None else None
    with train_autocast(run.target, cfg.autocast):
        r = batch_loss(run.head, run.target, run.lm_train, ids, mask, cfg, noise=True, generator=run.gen, feats=feats)
    run.opt.zero_grad(set_to_none=True)
    if r["count"]:
        r["loss"].backward()
        torch.nn.utils.clip_grad_value_(run.params, cfg.grad_clip)
        run.opt.step()
    run.step += 1
    s = run.sums
    s["loss"] += float(r["loss"].detach()); s["batches"] += 1
    s["vloss"] += r["vloss"] * r["count"]; s["ploss"] += r["ploss"] * r["count"]
    s["correct"] += r["correct"]; s["count"] += r["count"]
    return r


def _train_loop(run: _Run, last: dict, progress: bool) -> dict:
    """Steps up to cfg.steps over seeded, length-bucketed epochs (`_epoch_order`); a log record at
    each epoch's end and every `eval_every` steps, a checkpoint every `save_every` steps. Returns the
    latest record (`last` when the loop wrote none)."""
    from tqdm.auto import tqdm

    cfg, train = run.cfg, run.train
    bar = tqdm(total=cfg.steps, initial=min(run.step, cfg.steps), desc="training EAGLE head", unit="step",
               disable=not progress)
    lengths = [min(len(e.ids), cfg.max_len) for e in train]
    order = _epoch_order(lengths, cfg.batch_size, cfg.seed, run.epoch)
    while run.step < cfg.steps:
        if run.pos >= len(order):
            if run.sums["batches"]:             # (an eval record may already cover this step)
                last = _record(run, "epoch")
            run.epoch, run.pos = run.epoch + 1, 0
            order = _epoch_order(lengths, cfg.batch_size, cfg.seed, run.epoch)
        batch = [train[i] for i in order[run.pos:run.pos + cfg.batch_size]]
        run.pos += cfg.batch_size
        r = _train_step(run, batch)
        bar.update(1)
        bar.set_postfix(loss=f"{float(r['loss'].detach()):.3f}", top1=f"{r['correct'] / max(1, r['count']):.2f}",
                        epoch=run.epoch)
        if run.step % cfg.eval_every == 0 and run.step < cfg.steps:
            last = _record(run, "eval")
        if run.step % cfg.save_every == 0:
            _save_checkpoint(run)
    bar.close()
    return last


def train_eagle(target, examples: Sequence[Example], out_dir: str | Path, cfg: TrainConfig, *,
                resume: bool = False, progress: bool = True, log=print, publish: str | Path | None = None) -> dict:
    """Train an EAGLE head for `target` on `examples`; write checkpoint, log and the head to out_dir,
    and every head that improves validation top-1 to `publish` (see the module docstring).
    Returns the last log record. Raises ConfigError / RespecError on bad input."""

    cfg = dataclasses.replace(cfg).validate()
    out = Path(out_dir)
    check_out_dir(out, resume)
    data = _usable_split(examples, cfg)
    slug = target_slug(target)
    state = None
    if resume:
        state, cfg = _load_checkpoint(out / CHECKPOINT, slug, cfg, log)
    run = _start_run(target, cfg, state, data, slug, out, log, progress)
    if publish is not None:
        run.publish, run.data = Path(publish), data_summary(examples)
        run.best_score = published_score(run.publish, val_fingerprint(run.val, cfg.max_len), cfg.ttt_depth)
    _write_train_config(run)
    run.t0 = time.perf_counter()
    last = _record(run, "init") if state is None else {}
    last = _train_loop(run, last, progress)
    if run.sums["batches"] or not last:
        last = _record(run, "final")
    _save_checkpoint(run)
    save_eagle_head(run.head, out)
    return last
