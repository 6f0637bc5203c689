"""The EAGLE-1/2 draft head: the module and the target's output layer as tensors (checkpoint I/O:
respec/drafters/heads/checkpoint.py).

Contract (ALGORITHMS.md §4):
- `EagleHead` = fc(cat[embed(x_{t+1}), f_t]) -> one decoder layer without input norm -> f̂_{t+1}.
  Logits are the TARGET's lm_head(f̂); embeddings are the TARGET's (shared, never stored twice).
  The decoder layer is transformers' own LlamaDecoderLayer (Qwen2DecoderLayer when the checkpoint
  has q/k/v biases), with `input_layernorm` replaced by Identity. Nothing is forked.
- Checkpoints: a directory with `config.json` and `pytorch_model.bin` or `model.safetensors`, keys as
  published (`fc.weight`, `fc.bias`, `layers.0.self_attn.q_proj.weight`, ...; `embed_tokens.weight`
  is accepted and ignored). qkv bias and fc bias are inferred from the keys. `load_eagle_head` also
  takes a Hugging Face Hub id (downloaded with huggingface_hub where the Hub is reachable; one
  ModelLoadError where it is not). EAGLE-3 checkpoints (fused low/mid/high-layer features through
  a 3 x hidden `fc`, a `midlayer`, their own lm_head) are recognised and loaded by the same
  `load_eagle_head` (heads/checkpoint.py) as an `Eagle3Head` (respec/drafters/heads/eagle3.py: same interface, its
  `feature_layers` name the target features it reads); any other shape mismatch is a
  ModelLoadError, never a raw RuntimeError.
- Several GPUs: the head sits on the target's embedding device (`_to_target`).
- Optional reduced draft vocabulary (EAGLE-3's convention): a `d2t` tensor in the weights maps draft
  index i to target id i + d2t[i] (`t2d` is accepted and ignored). Such a head drafts only those
  ids, through the matching rows of the target's lm_head (a 6x smaller matmul on the default model);
  verification is unchanged, so output stays lossless. Published EAGLE-1/2 heads have no `d2t` and
  draft over the full vocabulary.
The drafter that runs the head (catch-up, tree search, auto budget) is respec/drafters/eagle2.py.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import ContextManager, Protocol

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig, Qwen2Config
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding, rotate_half
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

from respec.errors import ModelLoadError
from respec.models.attention import additive_mask
from respec.models.base import TargetModel
from respec.models.compat import pass_cache_as
from respec.models.kv import slab_cache
from respec.models.seeded import built_without_global_rng, seeded_init_
from respec.transfer import read, to_device

_HEAD_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "rms_norm_eps", "rope_theta", "rope_parameters", "max_position_embeddings", "hidden_act",
              "vocab_size", "head_dim")


@dataclass(frozen=True)
class LMHead:
    """A target's output layer as plain tensors (weight [V, H], bias [V] or None), softcap applied
    as the target applies it. `of(target, dtype)` takes the target's own (frozen) weights;
    `subset(ids)` keeps the rows of `ids` only (a reduced vocabulary: index i is token ids[i])."""
    weight: torch.Tensor
    bias: torch.Tensor | None
    softcap: float | None

    @classmethod
    def of(cls, target: TargetModel, dtype: torch.dtype) -> "LMHead":
        head = target.model.get_output_embeddings()
        bias = getattr(head, "bias", None)
        return cls(head.weight.detach().to(dtype), None if bias is None else bias.detach().to(dtype),
                   target.softcap)

    def subset(self, ids: torch.Tensor) -> "LMHead":
        ids = to_device(ids, self.weight.device, "lm-head rows")
        return LMHead(self.weight[ids].contiguous(), None if self.bias is None else self.bias[ids].contiguous(),
                      self.softcap)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., H] -> logits [..., V] (or [..., len(ids)] for a subset)."""
        logits = torch.nn.functional.linear(h.to(self.weight.device, self.weight.dtype), self.weight, self.bias)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def _to_target(head: "EagleHead", target: TargetModel, dtype: torch.dtype | None = None) -> "EagleHead":
    """Cast the head to the target's device and dtype (or `dtype`), keeping RoPE's inverse
    frequencies in float32 (as in training; a bf16 inv_freq would shift the angles at long
    positions)."""
    head = head.to(device=target.device, dtype=dtype or target.dtype)
    head.rotary = LlamaRotaryEmbedding(head.config).to(target.device)
    pass_cache_as(head.layers[0])     # the head passes cache=; older transformers name it past_key_values
    return head.eval()


def _rope_theta(config: LlamaConfig) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0) or 10000.0))


class HeadRoute(Protocol):
    """A faster way to run a head for one target (respec/accel/head_compile.py `CompiledHead`)."""
    target: TargetModel

    def forward(self, emb: torch.Tensor, feat: torch.Tensor, positions: torch.Tensor, cache: DynamicCache,
                mask: torch.Tensor | None) -> torch.Tensor:
        """EagleHead.forward's maths: emb, feat [q, H], positions [q] -> f̂ [q, H]."""

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """EagleHead.draft_logits for `target`: out [q, H] -> [q, V or Vd]."""

    def describe_routes(self) -> str:
        """How its draft output layer runs, per row count, in one line."""


class CallPlan(Protocol):
    """An eager linear plan (respec/accel/linear_layout.py `LinearLayouts`)."""

    def per_call(self) -> ContextManager:
        """A context inside which each linear call runs the way the plan measured faster."""


class EagleHead(nn.Module):
    """The EAGLE-1/2 draft head (one decoder layer). Forward works on one sequence."""

    feature_layers: tuple[int, ...] | None = None   # target features read: None = final norm (EAGLE-3: layers)

    def __init__(self, config: LlamaConfig, *, qkv_bias: bool = False, fc_bias: bool = True) -> None:
        super().__init__()
        config = LlamaConfig(**{**config.to_dict(), "num_hidden_layers": 1})
        config._attn_implementation = "sdpa"
        self.config = config
        self.qkv_bias = qkv_bias
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=fc_bias)
        if qkv_bias:
            qcfg = Qwen2Config(**{k: v for k, v in config.to_dict().items() if k != "model_type"})
            qcfg._attn_implementation = "sdpa"
            layer = Qwen2DecoderLayer(qcfg, layer_idx=0)
        else:
            layer = LlamaDecoderLayer(config, layer_idx=0)
        layer.input_layernorm = nn.Identity()        # EAGLE omits layer 0's input norm
        self.layers = nn.ModuleList([layer])
        self.rotary = LlamaRotaryEmbedding(config)
        self.draft_vocab: torch.Tensor | None = None  # [Vd] target ids the head drafts (None = all)
        self._draft_lm: tuple[TargetModel, LMHead] | None = None    # the rows for draft_vocab, cached
        self._row_ms: tuple[TargetModel, float] | None = None         # row_ms's measurement, cached
        self.route: HeadRoute | None = None                 # a compiled head, installed from respec/accel/
        self.eager_plan: tuple[TargetModel, CallPlan] | None = None   # the eager calls' linear plan, likewise

    def install_route(self, route: "HeadRoute | None") -> None:
        """Draft through `route` (a compiled head for `route.target`, respec/accel/head_compile.py)
        from now on, or eagerly with None; row_ms is timed again (between steps: the app holds its
        step lock)."""
        self.route, self._row_ms = route, None

    def install_eager_plan(self, target: TargetModel, plan: "CallPlan") -> None:
        """Eager calls without gradients for `target` run inside `plan.per_call()` from now on
        (the eager linear plan respec/accel/head_compile.py `plan_head_linears` measured)."""
        self.eager_plan = (target, plan)

    def _planned(self):
        """The eager plan's per-call context (a no-op while training or before planning)."""
        if self.eager_plan is None or torch.is_grad_enabled():
            return contextlib.nullcontext()
        return self.eager_plan[1].per_call()

    def output_layer_routes(self) -> str:
        """How the draft output layer runs: "eager", or the compiled head's routes per row count."""
        return "eager" if self.route is None else self.route.describe_routes()

    def draft_logits(self, target: TargetModel, out: torch.Tensor) -> torch.Tensor:
        """Logits of predicted features out [q, H] over the draft vocabulary: [q, V] (all target
        ids) or [q, Vd] (index i is target id draft_vocab[i]); through the installed route for its target."""
        route = self.route
        if route is not None and route.target is target:
            return route.draft_logits(out)
        return self.eager_draft_logits(target, out)

    def eager_draft_logits(self, target: TargetModel, out: torch.Tensor) -> torch.Tensor:
        """draft_logits, eager: the target's own lm_head rows."""
        with self._planned():
            if self.draft_vocab is None:
                return target.lm_head(out)
            if self._draft_lm is None or self._draft_lm[0] is not target:
                self._draft_lm = (target, self.draft_output_layer(target))
            return self._draft_lm[1](out)

    def draft_output_layer(self, target: TargetModel):
        """out [q, H] -> draft logits [q, V or Vd], built now and not cached on the head (what a
        compile traces, so its graph reads no state another thread may change)."""
        if self.draft_vocab is None:
            return target.lm_head
        return LMHead.of(target, target.dtype).subset(self.draft_vocab)

    def logits_over(self, target: TargetModel, out: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Logits of out [r, H] for the target ids `ids` [S] only (inside the draft vocabulary):
        [r, S]; the probe's cheap bound (respec/drafters/probe.py)."""
        return LMHead.of(target, target.dtype).subset(ids)(out)

    @staticmethod
    def causal_mask(mask: torch.Tensor | None, x: torch.Tensor, cache: DynamicCache) -> torch.Tensor | None:
        """`mask` as given, else for q > 1 rows x [1, q, H] the causal mask after the cache's rows
        ([1, 1, q, kv + q] additive; SDPA's own causal flag would ignore the cached prefix)."""
        if mask is None and x.shape[1] > 1:
            q = x.shape[1]
            causal = torch.ones(q, q, dtype=torch.bool, device=x.device).tril()                # [q, q]
            mask = additive_mask(~causal, cache.get_seq_length(), x.dtype)                   # [1, 1, q, kv]
        return mask

    @torch.inference_mode()
    def row_ms(self, target: TargetModel, reps: int = 3) -> float:
        """Milliseconds of the head's smallest draft: one row through the layer (a throwaway cache)
        and the draft output layer, the fastest of `reps` after a warm-up. Measured once per head
        and target, like the target's verify-cost curve, and cached."""
        if self._row_ms is not None and self._row_ms[0] is target:
            return self._row_ms[1]
        dev = target.device
        emb = target.embed(torch.zeros(1, dtype=torch.long, device=dev))                  # [1, H]
        pos = torch.ones(1, dtype=torch.long, device=dev)
        feat = emb.clone()      # its own tensor: a compiled graph for aliased inputs is another graph
        best, cache = float("inf"), slab_cache(self.config)
        self(emb, feat, pos - 1, cache, None)         # one cached row first: the calls below go as drafting's do
        for i in range(reps + 1):
            t0 = time.perf_counter()
            out = self(emb, feat, pos, cache, None)                                            # [1, H]
            top = torch.topk(torch.log_softmax(self.draft_logits(target, out).float(), dim=-1), 1)
            read(top.indices, label="row ms")       # read back, as a draft does (waits for its GPUs)
            if i:                                   # the first call of a shape pays allocation
                best = min(best, (time.perf_counter() - t0) * 1000)
            cache.crop(-1)
        self._row_ms = (target, best)
        return best

    def layer_input(self, emb: torch.Tensor, feat: torch.Tensor, fused: bool = True) -> torch.Tensor:
        """The decoder layer's input [..., H] from embeddings emb [..., H] and features feat
        [..., H]: fc(cat[emb, feat]) (EAGLE-1/2 feeds target and predicted features alike)."""
        return self.fc(torch.cat([emb, feat.to(emb.dtype)], dim=-1))

    def layer(self, emb: torch.Tensor, x: torch.Tensor, pos: torch.Tensor, cache, mask: torch.Tensor | None,
              cos_sin) -> torch.Tensor:
        """The decoder layer over a batch: x [B, q, H] (layer_input's), pos [B, q] -> [B, q, H];
        appends q rows per sequence to `cache`. `emb` is unused here (EAGLE-3's layer reads it)."""
        out = self.layers[0](x, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True,
                             position_embeddings=cos_sin)
        return out[0] if isinstance(out, tuple) else out

    def attention_input(self, emb: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """What the layer's attention projects, for layer inputs x [B, q, H] (`layer_input`'s) of
        embeddings emb [B, q, H]: x through the input norm (Identity in EAGLE-1/2)."""
        return self.layers[0].input_layernorm(x)

    def feed_context(self, emb: torch.Tensor, feat: torch.Tensor, positions: torch.Tensor,
                     cache: DynamicCache) -> None:
        """Append the keys and values of rows emb, feat [q, H] at positions [q] to `cache` without
        computing their outputs: what the decoder layer writes to its cache and nothing more (fc,
        the attention's input, k/v projections, RoPE on the keys), the same maths as `forward`'s
        rows. For context whose predictions nobody reads (a prompt but for the probe's rows): on
        the default model ~1/5 of a full row's multiply-adds, and no attention over the context."""
        x = self.layer_input(emb, feat)[None]                                       # [1, q, H]
        cos, sin = self.rotary(x, positions[None])                                  # [1, q, D] each
        a = self.attention_input(emb[None], x)                                      # [1, q, H or 2H]
        attn = self.layers[0].self_attn
        shape = (1, x.shape[1], -1, attn.head_dim)
        k = attn.k_proj(a).view(shape).transpose(1, 2)                             # [1, H_kv, q, D]
        v = attn.v_proj(a).view(shape).transpose(1, 2)                             # [1, H_kv, q, D]
        k = k * cos[:, None] + rotate_half(k) * sin[:, None]
        cache.update(k, v, 0)

    def forward(self, emb: torch.Tensor, feat: torch.Tensor, positions: torch.Tensor,
                cache: DynamicCache, mask: torch.Tensor | None) -> torch.Tensor:
        """emb, feat: [q, H] (EAGLE-3: feat may be fused target features); positions: [q]; mask:
        [1, 1, q, kv_len + q] additive or None (causal). Appends q rows to `cache`; returns
        predicted features f̂: [q, H]. Through the installed route (outside training)."""
        route = self.route if not torch.is_grad_enabled() else None
        if route is not None:
            return route.forward(emb, feat, positions, cache, mask)
        with self._planned():
            return self.eager_forward(emb, feat, positions, cache, mask)

    def eager_forward(self, emb: torch.Tensor, feat: torch.Tensor, positions: torch.Tensor,
                      cache: DynamicCache, mask: torch.Tensor | None) -> torch.Tensor:
        """forward, eager (what compiles)."""
        x = self.layer_input(emb, feat)[None]                                       # [1, q, H]
        pos = positions[None]
        cos_sin = self.rotary(x, pos)
        mask = self.causal_mask(mask, x, cache)
        return self.layer(emb[None], x, pos, cache, mask, cos_sin)[0]


def random_head(target: TargetModel, *, seed: int = 0, qkv_bias: bool = False,
                intermediate_size: int | None = None) -> EagleHead:
    """A randomly initialised head shaped for `target` (lossless, accepts little: for tests);
    `intermediate_size`: its MLP's width, the target's when None (a narrower one keeps a large
    target's head small)."""
    raw = {k: v for k, v in target.model.config.to_dict().items() if k in _HEAD_KEYS}
    cfg = LlamaConfig(**{**raw, **({"intermediate_size": intermediate_size} if intermediate_size else {})})
    # a local generator: the caller's global RNG is neither reseeded nor advanced
    head = seeded_init_(built_without_global_rng(lambda: EagleHead(cfg, qkv_bias=qkv_bias)), seed)
    return _to_target(head, target)


def stored_dtype(state: dict[str, torch.Tensor]) -> torch.dtype:
    """The checkpoint's floating dtype (fc's): a head is loaded in it, so no value passes through
    a narrower dtype on its way to the target's (a float64 head loads bit-identically)."""
    fc = state.get("fc.weight")
    return fc.dtype if fc is not None and fc.is_floating_point() else torch.float32


def load_weights(head: EagleHead, state: dict[str, torch.Tensor], what: str) -> EagleHead:
    """`state` (this module's keys) into `head`, in the checkpoint's dtype; one ModelLoadError
    naming the first size mismatch, or the missing and unexpected keys (rotary buffers excepted)."""
    head = head.to(stored_dtype(state))
    try:
        missing, unexpected = head.load_state_dict(state, strict=False)
    except RuntimeError as exc:   # size mismatches: name the first one, not torch's whole report
        detail = next((line.strip() for line in str(exc).splitlines() if "size mismatch" in line), str(exc)[:300])
        raise ModelLoadError(f"{what} does not match its config.json: {detail}") from None
    missing = [k for k in missing if not k.startswith("rotary")]
    if missing or unexpected:
        raise ModelLoadError(f"{what}: missing keys {missing}, unexpected keys {unexpected}")
    return head


def head_config(head: EagleHead, architecture: str) -> dict:
    """config.json's common part for `head`: its shape keys, one layer, the RoPE base."""
    cfg = {k: v for k, v in head.config.to_dict().items() if k in _HEAD_KEYS and k != "rope_parameters"}
    cfg.update({"architectures": [architecture], "model_type": "llama", "num_hidden_layers": 1,
                "rope_theta": _rope_theta(head.config)})
    return cfg
