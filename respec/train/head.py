"""The trainable EAGLE head: construction, initialisation and its batched training forward.

Contract:
- `make_head(target, seed=, init_from_last_layer=, arch=, draft_vocab=)`: a fresh head shaped for
  `target` (`arch` "eagle": EAGLE-1/2; "eagle3": an Eagle3Head over the target's low/mid/high
  features with its own lm_head over `draft_vocab`), in the training dtype (`train_dtype`: float32,
  float64 for float64 targets); the caller's RNG untouched.
- `train_autocast(target, mode)`: the training step's autocast: bf16 matmuls over float32 weights,
  optimiser state and loss reductions when `mode` is "bf16", or "auto" and the target runs in bf16
  (the device default where the CPU has bf16 instructions, and on CUDA); otherwise none. On a
  2-core Zen 4 it halves a Qwen2.5-1.5B head's step (docs/benchmarks-history.md, 2026-12-08).
- `initial_head(target, cfg, state, log)`: that head with its starting weights: a checkpoint's
  (`state`, when resuming), a saved head's (`cfg.init_from`), or fresh.
- The training forward (`head_unroll`, depth 0 = `head_forward`) calls the head's own
  `layer_input` / `layer` / `rotary` (the inference forward's parts) on [B, T] batches with right padding and the causal mask; padded positions
  never precede real ones, so no padding mask is needed, and a test checks it equals
  `EagleHead.forward` on each sequence. Depths >= 1 are training-time test (EAGLE-3's unrolled
  training), masked by `ttt_mask` as Eagle2Drafter's tree mask does at inference.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from respec.drafters.heads.checkpoint import load_eagle_head

from respec.drafters.heads.eagle import random_head
from respec.drafters.heads.eagle3 import random_eagle3_head
from respec.errors import RespecError


def train_dtype(target) -> torch.dtype:
    return torch.float64 if target.dtype == torch.float64 else torch.float32


AUTOCAST_MODES = ("auto", "bf16", "off")


def train_autocast(target, mode: str):
    """The context a training step's forward runs in (see the module contract)."""
    if mode == "bf16" or (mode == "auto" and target.dtype == torch.bfloat16):
        return torch.autocast(torch.device(target.device).type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _target_layers(target):
    layers = getattr(target._base, "layers", None)
    if layers is None or len(layers) == 0:
        raise RespecError("the target exposes no decoder layers (`get_decoder().layers`)")
    return layers


def make_head(target, *, seed: int = 0, init_from_last_layer: bool = False, arch: str = "eagle",
              draft_vocab: torch.Tensor | None = None, intermediate_size: int | None = None):
    """A fresh trainable head shaped for `target` (q/k/v biases iff the target's layers have them);
    `arch` "eagle3" makes an EAGLE-3 head whose lm_head covers `draft_vocab` (all ids if None).
    With `init_from_last_layer`, the decoder layer starts as a copy of the target's last layer (its
    input RMSNorm weight folded into q/k/v, since the head has no input norm) and fc starts as
    [small random | identity], i.e. it passes f_t through. `intermediate_size`: the head's MLP width
    (the target's when None; a narrower MLP cannot start from the target's last layer)."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    last = _target_layers(target)[-1]
    qkv_bias = getattr(getattr(last.self_attn, "q_proj", None), "bias", None) is not None
    dtype = train_dtype(target)
    if arch == "eagle3":
        head = random_eagle3_head(target, seed=seed, qkv_bias=qkv_bias, draft_vocab=draft_vocab,
                                  intermediate_size=intermediate_size).to(dtype=dtype)
    else:
        head = random_head(target, seed=seed, qkv_bias=qkv_bias, intermediate_size=intermediate_size).to(dtype=dtype)
    with torch.random.fork_rng(devices=[]):          # re-init in full precision, caller's RNG untouched
        torch.manual_seed(seed)
        head.fc.reset_parameters()
        head.layers[0].apply(lambda m: m.reset_parameters() if isinstance(m, torch.nn.Linear) else None)
        if arch == "eagle3":                         # its own output layer (norms start at ones)
            head.lm_head.reset_parameters()
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


def initial_head(target, cfg, state: dict[str, Any] | None, log: Callable[[str], None],
                 draft_vocab: torch.Tensor | None = None):
    """`make_head` for `cfg` (a TrainConfig) with its starting weights: the checkpoint's head when
    `state` (a loaded checkpoint) is given, else the saved head in `cfg.init_from` (fine-tuning; its
    rotary buffers are rebuilt, not loaded), else the fresh initialisation. An EAGLE-3 head started
    from a saved one keeps that head's draft vocabulary (its lm_head's rows)."""
    if cfg.arch == "eagle3" and cfg.init_from:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        head = load_eagle_head(cfg.init_from, target, train_dtype(target))
        if head.feature_layers is None:
            raise RespecError(f"--arch eagle3 cannot start from {cfg.init_from}: it is an EAGLE-1/2 head")
        head.rotary = LlamaRotaryEmbedding(head.config).to(target.device)
        if state is not None:
            head.load_state_dict(state["head"])
        else:
            log(f"starting from the EAGLE-3 head in {cfg.init_from}")
        return head.train()
    head = make_head(target, seed=cfg.seed, init_from_last_layer=cfg.init_from_last_layer and state is None,
                     arch=cfg.arch, draft_vocab=draft_vocab, intermediate_size=cfg.head_intermediate or None)
    if state is not None:
        head.load_state_dict(state["head"])
    elif cfg.init_from:
        src = {k: v for k, v in load_eagle_head(cfg.init_from, target, train_dtype(target)).state_dict().items()
               if not k.startswith("rotary")}
        missing, unexpected = head.load_state_dict(src, strict=False)
        missing = [k for k in missing if not k.startswith("rotary")]
        if missing or unexpected:
            raise RespecError(f"cannot start from the head in {cfg.init_from}: missing keys {missing}, "
                              f"unexpected keys {unexpected}")
        log(f"starting from the head in {cfg.init_from}")
    return head


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
    position t - 1 in place of the real feature f_t, attending as `ttt_mask` says. emb: [B, T, H];
    feat: [B, T, H] (EAGLE-3: fused target features [B, T, 3H]). Returns `depth` tensors [B, T, H];
    entry d at position t predicts f_{t+1} (EAGLE-3: the pre-norm output whose logits predict
    x_{t+2}), meaningful for t >= d."""
    from transformers import DynamicCache

    B, T, _ = emb.shape
    pos = torch.arange(T, device=emb.device)[None].expand(B, -1)
    cache = DynamicCache()
    preds: list[torch.Tensor] = []
    inp = feat
    cos_sin = first = None
    for d in range(depth):
        x = head.layer_input(emb, inp, fused=(d == 0))                             # [B, T, H]
        if cos_sin is None:
            cos_sin = head.rotary(x, pos)
            # position 0's input at later depths (a placeholder: depth d is scored from t >= d on)
            first = (feat if head.feature_layers is None else x)[:, :1]
        mask = None if d == 0 else ttt_mask(T, d, x.dtype, x.device)
        out = head.layer(emb, x, pos, cache, mask, cos_sin)                        # [B, T, H]
        preds.append(out)
        if d + 1 < depth:
            inp = torch.cat([first, out[:, :-1]], dim=1)
    return preds
