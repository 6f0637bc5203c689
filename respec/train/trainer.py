"""EAGLE head training (ALGORITHMS.md §4.7), batched and cache-free, resumable.

Alignment: a sequence x_0..x_{n-1} has target features f_0..f_{n-1} (final-norm hidden states;
lm_head(f_t) predicts x_{t+1}). Head position t takes the pair (f_t + noise, x_{t+1}) and predicts
f̂_{t+1}; head positions are 0..n-2, exactly as the inference head (EagleHead.forward) numbers them.
The loss covers predicted features f̂_j with j >= example.start (j >= 1):
    L = v_w * SmoothL1(f̂_j, f_j)  (mean over hidden dims)  +  p_w * CE(softmax(lm_head(f_j)), log_softmax(lm_head(f̂_j)))
averaged over covered positions. Top-1 = argmax lm_head(f̂_j) == argmax lm_head(f_j), i.e. the
target's own next token (what greedy verification accepts).

The training forward calls the head's own modules (`fc`, `layers[0]`, `rotary`) on [B, T] batches
with right padding and the causal mask; padded positions never precede real ones, so no padding
mask is needed, and a test checks it equals `EagleHead.forward` on each sequence.

Speed options (CPU training is dominated by two costs, measured on the default model: the target
forward that makes features, and the 49k-vocab lm_head in the soft cross-entropy):
- `cache_features`: compute every example's features once, keep them in memory in the target's
  dtype, and train from them (features do not change: the target is frozen). Costs
  tokens x hidden x 2 bytes of memory (about 0.5 GB for 450k tokens of a 576-wide model).
- `draft_vocab = N > 0`: the soft cross-entropy (and the running train top-1) are computed over the
  N token ids that most often are the target's next token in the training data (a fixed sampled
  softmax; the target's distribution is renormalised over them), and the saved head carries them
  as its draft vocabulary (`d2t`, EAGLE-3's convention): it drafts only those ids, through the
  matching rows of the shared lm_head, which makes each head step cheaper. Verification is
  unchanged (lossless). Validation top-1 is always over the full vocabulary.

Optimiser: AdamW (betas 0.9/0.95), `clip_grad_value_`, linear warm-up then linear decay to
`min_lr_ratio` at `steps`. The head trains in float32 (float64 for float64 targets) and is saved in
the published format (config.json + model.safetensors) via `save_eagle_head`.

Out dir: `checkpoint.pt` (head + optimizer + step + RNG, written atomically every `save_every` steps
and at the end), `training_log.jsonl` (one JSON line per evaluation), `train_config.json`, and the
final head files. `resume=True` continues from the checkpoint's step (to a possibly larger `steps`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F

from respec.drafters.eagle2 import LMHead
from respec.errors import ConfigError, RespecError
from respec.train.data import Example, is_validation, target_slug

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

    def validate(self) -> "TrainConfig":
        ints = {"steps": 1, "batch_size": 1, "max_len": 4, "warmup": 0, "val_max_examples": 1,
                "eval_every": 1, "save_every": 1, "draft_vocab": 0, "ttt_depth": 1}
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
        return self


# ------------------------------------------------------------------------------------ model pieces
def train_dtype(target) -> torch.dtype:
    return torch.float64 if target.dtype == torch.float64 else torch.float32


def _target_layers(target):
    layers = getattr(target._base, "layers", None)
    if layers is None or len(layers) == 0:
        raise RespecError("the target exposes no decoder layers (`get_decoder().layers`)")
    return layers


def make_head(target, *, seed: int = 0, init_from_last_layer: bool = False):
    """A fresh trainable head shaped for `target` (q/k/v biases iff the target's layers have them).
    With `init_from_last_layer`, the decoder layer starts as a copy of the target's last layer (its
    input RMSNorm weight folded into q/k/v, since the head has no input norm) and fc starts as
    [small random | identity], i.e. it passes f_t through."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    from respec.drafters.eagle2 import random_head

    last = _target_layers(target)[-1]
    qkv_bias = getattr(getattr(last.self_attn, "q_proj", None), "bias", None) is not None
    dtype = train_dtype(target)
    head = random_head(target, seed=seed, qkv_bias=qkv_bias).to(dtype=dtype)
    with torch.random.fork_rng(devices=[]):          # re-init in full precision, caller's RNG untouched
        torch.manual_seed(seed)
        head.fc.reset_parameters()
        head.layers[0].apply(lambda m: m.reset_parameters() if isinstance(m, torch.nn.Linear) else None)
    head.rotary = LlamaRotaryEmbedding(head.config).to(target.device)   # inv_freq in float32
    if init_from_last_layer:
        with torch.no_grad():
            src = {k: v.detach().to(dtype) for k, v in last.state_dict().items()
                   if not k.startswith("input_layernorm")}
            norm = getattr(last, "input_layernorm", None)
            w = getattr(norm, "weight", None)
            if w is not None:
                for p in ("q_proj", "k_proj", "v_proj"):
                    key = f"self_attn.{p}.weight"
                    if key in src:
                        src[key] = src[key] * w.detach().to(dtype)[None, :]
            missing, unexpected = head.layers[0].load_state_dict(src, strict=False)
            if missing or unexpected:
                raise RespecError(f"cannot initialise the head from the target's last layer: "
                                  f"missing {missing}, unexpected {unexpected}")
            h = head.config.hidden_size
            head.fc.weight[:, :h].mul_(0.1)
            head.fc.weight[:, h:].copy_(torch.eye(h, dtype=dtype))
            if head.fc.bias is not None:
                head.fc.bias.zero_()
    return head.train()


def frequent_next_tokens(examples: Sequence[Example], n: int, max_len: int) -> torch.Tensor:
    """The `n` ids that most often are a covered next token (positions >= max(start, 1), within
    max_len) in `examples` (ties broken by the smaller id), returned in ascending id order: the
    reduced cross-entropy and draft vocabulary."""
    from collections import Counter
    counts: Counter = Counter()
    for e in examples:
        counts.update(e.ids[max(e.start, 1):max_len])
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return torch.tensor(sorted(i for i, _ in ranked), dtype=torch.long)


class FeatureCache:
    """Target features of each example, computed once: key -> [min(len, max_len), H] in the target's
    dtype on the CPU. Examples are batched by similar length so little padding is computed."""

    def __init__(self, target, examples: Sequence[Example], max_len: int, batch_tokens: int = 4096,
                 progress: bool = True, store: Path | None = None) -> None:
        """With `store` (a safetensors file), features found there for the same example (its key
        and token ids) and at least the needed length are reused, and the file is rewritten with
        every example's features after computing the rest: a later run skips the target forwards."""
        from tqdm.auto import tqdm
        self.feats: dict[str, torch.Tensor] = {}
        wanted = {e.key: e for e in examples}
        saved = self._load(store, wanted, max_len) if store is not None and Path(store).is_file() else {}
        self.feats.update(saved)
        todo = sorted((e for k, e in wanted.items() if k not in saved), key=lambda e: len(e.ids))
        bar = tqdm(total=sum(min(len(e.ids), max_len) for e in todo), desc="target features", unit="tok",
                   disable=not progress)
        i = 0
        while i < len(todo):
            j = i + 1
            while j < len(todo) and min(len(todo[j].ids), max_len) * (j - i + 1) <= batch_tokens:
                j += 1
            group = todo[i:j]
            ids, _ = collate(group, max_len)
            f = target_features(target, ids).cpu()
            for k, e in enumerate(group):
                n = min(len(e.ids), max_len)
                self.feats[e.key] = f[k, :n].clone()
                bar.update(n)
            i = j
        bar.close()
        if store is not None and todo:
            self._save(Path(store), wanted)

    @staticmethod
    def _name(e: Example) -> str:
        ids = hashlib.sha1(",".join(map(str, e.ids)).encode()).hexdigest()[:16]
        return f"{e.key}|{ids}"

    def _load(self, store: Path, wanted: dict[str, Example], max_len: int) -> dict[str, torch.Tensor]:
        from safetensors import safe_open
        out = {}
        with safe_open(str(store), framework="pt") as f:
            names = set(f.keys())
            for k, e in wanted.items():
                name = self._name(e)
                if name in names:
                    t = f.get_tensor(name)
                    if t.shape[0] >= min(len(e.ids), max_len):
                        out[k] = t[:min(len(e.ids), max_len)].clone()
        return out

    def _save(self, store: Path, wanted: dict[str, Example]) -> None:
        from safetensors.torch import save_file
        store.parent.mkdir(parents=True, exist_ok=True)
        tmp = store.with_name(f".{store.name}.tmp")
        save_file({self._name(e): self.feats[k].contiguous() for k, e in wanted.items()}, str(tmp))
        os.replace(tmp, store)

    def batch(self, examples: Sequence[Example], T: int) -> torch.Tensor:
        """[B, T, H] right-padded with zeros (padding is never covered by the loss mask)."""
        first = self.feats[examples[0].key]
        out = torch.zeros((len(examples), T, first.shape[-1]), dtype=first.dtype)
        for b, e in enumerate(examples):
            f = self.feats[e.key]
            out[b, :f.shape[0]] = f
        return out


@torch.inference_mode()
def target_features(target, ids: torch.Tensor) -> torch.Tensor:
    """Final-norm hidden states [B, T, H] of a right-padded batch (padding only follows real tokens,
    so the causal mask alone keeps real positions exact)."""
    return target._base(input_ids=ids.to(target.device), use_cache=False).last_hidden_state


def head_forward(head, emb: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:
    """Batched head forward (no KV cache kept): emb = embed(x_{t+1}), feat = f_t, both [B, T, H] ->
    f̂_{t+1} [B, T, H], positions 0..T-1, causal attention (depth 0 of `head_unroll`)."""
    return head_unroll(head, emb, feat, 1)[0]


def ttt_mask(T: int, d: int, dtype: torch.dtype, device=None) -> torch.Tensor:
    """Additive attention mask [1, 1, T, (d+1)T] for unrolled depth d (0-based) of a T-position
    sequence whose depths 0..d are laid out one after another in the key axis.

    Depth d at position t is the d-th draft step of a chain whose real (teacher-forced) context ends
    at position t - d: it sees depth-0 keys s <= t - d (what the drafter holds in its KV cache after
    catch-up) and, for each depth i in 1..d, its own chain's node at position t - d + i (its
    ancestors in the draft tree, and itself), exactly as Eagle2Drafter's tree mask does."""
    allowed = torch.zeros(T, (d + 1) * T, dtype=torch.bool)
    allowed[:, :T] = torch.ones(T, T, dtype=torch.bool).tril(-d)
    t = torch.arange(T)
    for i in range(1, d + 1):
        s = t - d + i
        ok = s >= 0
        allowed[t[ok], i * T + s[ok]] = True
    mask = torch.zeros(1, 1, T, (d + 1) * T, dtype=dtype)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min).to(device)


def head_unroll(head, emb: torch.Tensor, feat: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """Training-time test (EAGLE-3's unrolled training): depth 0 is the plain causal forward over
    the pairs (f_t, x_{t+1}); depth d >= 1 feeds the head its own depth-(d-1) prediction for
    position t - 1 in place of the real feature f_t, attending as `ttt_mask` says. emb, feat: [B, T, H]. Returns `depth` tensors
    [B, T, H]; entry d at position t predicts f_{t+1} (meaningful for t >= d)."""
    from transformers import DynamicCache

    B, T, _ = emb.shape
    pos = torch.arange(T, device=emb.device)[None].expand(B, -1)
    cache = DynamicCache()
    preds: list[torch.Tensor] = []
    inp = feat
    cos_sin = None
    for d in range(depth):
        x = head.fc(torch.cat([emb, inp], dim=-1))                                 # [B, T, H]
        if cos_sin is None:
            cos_sin = head.rotary(x, pos)
        mask = None if d == 0 else ttt_mask(T, d, x.dtype, x.device)
        out = head.layers[0](x, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True,
                             position_embeddings=cos_sin)
        out = out[0] if isinstance(out, tuple) else out                            # [B, T, H]
        preds.append(out)
        if d + 1 < depth:
            inp = torch.cat([feat[:, :1], out[:, :-1]], dim=1)
    return preds


def collate(examples: Sequence[Example], max_len: int, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] right-padded, and the loss mask over predicted features [B, T-1] (entry t covers
    f̂_{t+1}: real, and t+1 >= start)."""
    seqs = [list(e.ids[:max_len]) for e in examples]
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), T - 1), dtype=torch.bool)
    for i, (s, e) in enumerate(zip(seqs, examples)):
        ids[i, :len(s)] = torch.tensor(s)
        lo = max(e.start, 1)
        if lo < len(s):
            mask[i, lo - 1:len(s) - 1] = True
    return ids, mask


def batch_loss(head, target, lm: LMHead, ids: torch.Tensor, mask: torch.Tensor, cfg: TrainConfig,
               noise: bool, generator: torch.Generator | None = None, feats: torch.Tensor | None = None) -> dict:
    """Loss on one batch; `feats` [B, T, H] are cached target features of `ids` (computed if None),
    `lm` may be a vocabulary subset (LMHead.subset) for the cross-entropy and top-1.
    With cfg.ttt_depth > 1 the loss is the ttt_decay**d-weighted mean over unrolled depths d
    (`head_unroll`); vloss/ploss/correct/count describe depth 0, `depth_correct`/`depth_count`
    every depth."""
    dtype = lm.weight.dtype
    dev = target.device
    mask = mask.to(dev)
    if feats is None:
        feats = target_features(target, ids)
    feats = feats.to(device=dev, dtype=dtype).clone()                   # [B, T, H]
    emb = target.embed(ids[:, 1:].to(dev)).detach().to(dtype)
    inp = feats[:, :-1]
    if noise and cfg.noise > 0:
        u = torch.rand(inp.shape, generator=generator, dtype=dtype).to(dev)
        inp = inp + (u - 0.5) * cfg.noise
    preds = head_unroll(head, emb, inp, cfg.ttt_depth)                  # each [B, T-1, H]
    ft_all = feats[:, 1:][mask]                                          # [N, H] covered targets
    pos = torch.arange(mask.shape[1], device=dev).expand_as(mask)[mask]  # [N] their positions
    if ft_all.shape[0]:
        with torch.no_grad():                                            # soft labels, shared by every depth
            t_logits_all = lm(ft_all)
            t_prob_all = torch.softmax(t_logits_all, -1)
            t_top_all = t_logits_all.argmax(-1)
    total, weights = None, 0.0
    res = {"depth_correct": [], "depth_count": []}
    for d, pred in enumerate(preds):
        keep = pos >= d                      # depth d at position t needs t >= d (a real chain start)
        fh, ft = pred[mask][keep], ft_all[keep]                          # [N_d, H]
        n = int(fh.shape[0])
        if n == 0:
            loss_d, vloss, ploss, correct = pred.sum() * 0.0, 0.0, 0.0, 0
        else:
            vloss_t = F.smooth_l1_loss(fh, ft, reduction="none").mean(-1).mean()
            h_logits = lm(fh)
            ploss_t = -(t_prob_all[keep] * torch.log_softmax(h_logits, -1)).sum(-1).mean()
            loss_d = cfg.v_weight * vloss_t + cfg.p_weight * ploss_t
            vloss, ploss = float(vloss_t.detach()), float(ploss_t.detach())
            correct = int((h_logits.detach().argmax(-1) == t_top_all[keep]).sum())
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
             cache: FeatureCache | None = None) -> dict:
    was = head.training
    head.eval()
    tot = {"loss": 0.0, "vloss": 0.0, "ploss": 0.0, "correct": 0, "count": 0}
    dc = [0] * cfg.ttt_depth
    dn = [0] * cfg.ttt_depth
    for i in range(0, len(examples), cfg.batch_size):
        chunk = examples[i:i + cfg.batch_size]
        ids, mask = collate(chunk, cfg.max_len)
        feats = cache.batch(chunk, ids.shape[1]) if cache is not None else None
        r = batch_loss(head, target, lm, ids, mask, cfg, noise=False, feats=feats)
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


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


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


def train_eagle(target, examples: Sequence[Example], out_dir: str | Path, cfg: TrainConfig, *,
                resume: bool = False, progress: bool = True, log=print) -> dict:
    """Train an EAGLE head for `target` on `examples`; write checkpoint, log and the head to out_dir.
    Returns the last log record. Raises ConfigError / RespecError on bad input."""
    from tqdm.auto import tqdm
    from respec.drafters.eagle2 import save_eagle_head

    cfg = dataclasses.replace(cfg).validate()
    out = Path(out_dir)
    ckpt_path = out / CHECKPOINT
    if out.exists() and not out.is_dir():
        raise RespecError(f"--out {out} exists and is not a directory")
    if resume and not ckpt_path.is_file():
        raise RespecError(f"cannot resume: no {CHECKPOINT} in {out}")
    if not resume and ckpt_path.is_file():
        raise RespecError(f"{out} already holds a training checkpoint; pass --resume to continue it "
                          f"or choose another --out")
    examples = [e for e in examples if len(e.ids) >= 2 and max(e.start, 1) < min(len(e.ids), cfg.max_len)]
    if not examples:
        raise RespecError("no training data: every example is empty or shorter than 2 tokens")
    train, val = split(examples, cfg.val_fraction, cfg.val_max_examples)
    slug = target_slug(target)

    state = None
    if resume:
        state = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        if state.get("target") != slug:
            raise RespecError(f"checkpoint in {out} was trained for {state.get('target')!r}, not {slug!r}")
        saved = TrainConfig(**state["config"])
        # the run's shape stays as it was; cadence and length may change
        # (speed options may change too: they do not change what is learned, only how fast)
        cfg = dataclasses.replace(saved, steps=cfg.steps, eval_every=cfg.eval_every,
                                  save_every=cfg.save_every, cache_features=cfg.cache_features,
                                  feature_store=cfg.feature_store,
                                  draft_vocab=cfg.draft_vocab).validate()
        if state["step"] >= cfg.steps:
            log(f"checkpoint is already at step {state['step']} >= --steps {cfg.steps}; writing the head only")

    head = make_head(target, seed=cfg.seed, init_from_last_layer=cfg.init_from_last_layer and state is None)
    if state is not None:
        head.load_state_dict(state["head"])
    elif cfg.init_from:
        from respec.drafters.eagle2 import load_eagle_head
        src = {k: v for k, v in load_eagle_head(cfg.init_from, target, train_dtype(target)).state_dict().items()
               if not k.startswith("rotary")}
        missing, unexpected = head.load_state_dict(src, strict=False)
        missing = [k for k in missing if not k.startswith("rotary")]
        if missing or unexpected:
            raise RespecError(f"cannot start from the head in {cfg.init_from}: missing keys {missing}, "
                              f"unexpected keys {unexpected}")
        log(f"starting from the head in {cfg.init_from}")
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    step, epoch, pos = 0, 0, 0
    gen = torch.Generator().manual_seed(cfg.seed)
    if state is not None:
        opt.load_state_dict(state["optimizer"])
        step, epoch, pos = state["step"], state["epoch"], state["pos"]
        gen.set_state(state["noise_rng"])
    lm = LMHead.of(target, train_dtype(target))
    lm_train = lm
    if cfg.draft_vocab:
        vocab = frequent_next_tokens(train, cfg.draft_vocab, cfg.max_len)
        lm_train = lm.subset(vocab)
        head.draft_vocab = vocab                # saved as d2t: the head drafts over these ids only
        log(f"cross-entropy and drafting over the {len(vocab)} most frequent next tokens of the training data")
    cache = None
    if cfg.cache_features and step < cfg.steps:
        store = Path(cfg.feature_store) if cfg.feature_store else None
        cache = FeatureCache(target, train + val, cfg.max_len, progress=progress, store=store)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_config.json").write_text(json.dumps(
        {**dataclasses.asdict(cfg), "target": slug, "train_examples": len(train), "val_examples": len(val),
         "train_tokens": sum(len(e.ids) for e in train)}, indent=2))

    def save_ckpt():
        _atomic_save({"step": step, "epoch": epoch, "pos": pos, "head": head.state_dict(),
                      "optimizer": opt.state_dict(), "config": dataclasses.asdict(cfg), "target": slug,
                      "noise_rng": gen.get_state()}, ckpt_path)

    run = {"loss": 0.0, "vloss": 0.0, "ploss": 0.0, "correct": 0, "count": 0, "batches": 0}
    t0 = time.perf_counter()
    last: dict = {}

    def record(event: str) -> dict:
        nonlocal run
        c = run["count"]
        rec = {"event": event, "step": step, "epoch": epoch, "lr": lr_at(max(step - 1, 0), cfg),
               "train_loss": run["loss"] / run["batches"] if run["batches"] else None,
               "train_vloss": run["vloss"] / c if c else None, "train_ploss": run["ploss"] / c if c else None,
               "train_top1": run["correct"] / c if c else None, "train_tokens": c}
        v = evaluate(head, target, lm, val, cfg, cache) if val else {}
        rec.update({f"val_{k}": x for k, x in v.items()})
        rec["elapsed_s"] = round(time.perf_counter() - t0, 2)
        with open(out / LOG, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")
        run = {"loss": 0.0, "vloss": 0.0, "ploss": 0.0, "correct": 0, "count": 0, "batches": 0}
        log(f"[{event}] step {step} epoch {epoch}: "
            + (f"train loss {rec['train_loss']:.4f} top1 {rec['train_top1']:.3f}" if c else "untrained")
            + (f" | val loss {rec['val_loss']:.4f} top1 {rec['val_top1']:.3f} ({rec['val_tokens']} tok)" if v else "")
            + "".join(f" depth{d + 1} {rec[f'val_top1_depth{d + 1}']:.3f}" for d in range(1, cfg.ttt_depth) if v))
        return rec

    if state is None:
        last = record("init")
    bar = tqdm(total=cfg.steps, initial=min(step, cfg.steps), desc="training EAGLE head", unit="step",
               disable=not progress)
    lengths = [min(len(e.ids), cfg.max_len) for e in train]
    order = _epoch_order(lengths, cfg.batch_size, cfg.seed, epoch)
    while step < cfg.steps:
        if pos >= len(order):
            if run["batches"]:                  # (an eval record may already cover this step)
                last = record("epoch")
            epoch, pos = epoch + 1, 0
            order = _epoch_order(lengths, cfg.batch_size, cfg.seed, epoch)
        batch = [train[i] for i in order[pos:pos + cfg.batch_size]]
        pos += cfg.batch_size
        ids, mask = collate(batch, cfg.max_len)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        feats = cache.batch(batch, ids.shape[1]) if cache is not None else None
        r = batch_loss(head, target, lm_train, ids, mask, cfg, noise=True, generator=gen, feats=feats)
        opt.zero_grad(set_to_none=True)
        if r["count"]:
            r["loss"].backward()
            torch.nn.utils.clip_grad_value_(params, cfg.grad_clip)
            opt.step()
        step += 1
        run["loss"] += float(r["loss"].detach()); run["batches"] += 1
        run["vloss"] += r["vloss"] * r["count"]; run["ploss"] += r["ploss"] * r["count"]
        run["correct"] += r["correct"]; run["count"] += r["count"]
        bar.update(1)
        bar.set_postfix(loss=f"{float(r['loss'].detach()):.3f}", top1=f"{r['correct'] / max(1, r['count']):.2f}", epoch=epoch)
        if step % cfg.eval_every == 0 and step < cfg.steps:
            last = record("eval")
        if step % cfg.save_every == 0:
            save_ckpt()
    bar.close()
    if run["batches"] or not last:
        last = record("final")
    save_ckpt()
    save_eagle_head(head, out)
    return last
