"""The EAGLE-3 draft head: fused low/mid/high-layer target features, its own output layer.

Contract (the published `LlamaForCausalLMEagle3` layout, as EAGLE-3, SpecForge and vLLM read it):
- Target features: the inputs of three target decoder layers (`feature_layers`; default
  (2, L // 2, L - 3) for an L-layer target, or the config's `eagle_aux_hidden_state_layer_ids`),
  concatenated: [n, 3 x H_target]. The engine asks the target for them (`HFTarget.use_features`)
  whenever a drafter with this head runs, so catch-up and every verification return them.
- Forward (one sequence): g = fc(fused) [q, H] when the input is fused target features, or the
  head's own previous output [q, H] at draft depths >= 2 (no fc); then ONE decoder layer whose
  attention reads cat[input_layernorm(embed(x_{t+1})), hidden_norm(g)] (2 x H wide), with residual
  g (or hidden_norm(g) where the config says `norm_before_residual`), post-attention norm and MLP
  as in a Llama layer. The output is pre-norm; logits are the head's own lm_head(norm(out)) over
  its draft vocabulary, index i being target id i + d2t[i] (`t2d` is derived, never trusted).
- The layer's modules are transformers' own (LlamaAttention / Qwen2Attention with q/k/v widened
  to 2 x H, LlamaMLP, LlamaRMSNorm), composed here, nothing forked. The attention takes the same
  KV cache, masks and positions as an EAGLE-1/2 head, so `Eagle2Drafter` runs either kind.
- Checkpoint keys as published: `fc.weight`, `midlayer.{input_layernorm,hidden_norm,
  post_attention_layernorm}.weight`, `midlayer.self_attn.{q,k,v,o}_proj.*`, `midlayer.mlp.*`,
  `norm.weight`, `lm_head.weight`, `d2t`, `t2d`; `embed_tokens.weight` is ignored (the target's
  embedding is used). `load_eagle_head` / `save_eagle_head` (respec/drafters/heads/eagle.py) read
  and write that layout through `build_eagle3_head` / `eagle3_state_and_config`.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from respec.drafters.heads.eagle import _HEAD_KEYS, EagleHead, LMHead, _to_target, head_config, load_weights
from respec.errors import ModelLoadError
from respec.models.base import TargetModel
from respec.models.compat import pass_cache_as
from respec.models.seeded import built_without_global_rng, seeded_init_

EAGLE3_ARCH = "LlamaForCausalLMEagle3"


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low/mid/high target layers for an L-layer target: (2, L // 2, L - 3), clamped
    into range for very shallow targets."""
    top = max(num_layers - 1, 0)
    return tuple(min(max(i, 0), top) for i in (2, num_layers // 2, num_layers - 3))  # type: ignore[return-value]


class Eagle3Head(EagleHead):
    """An EAGLE-3 head: `EagleHead`'s interface (forward, draft_logits, logits_over, row_ms) over
    the EAGLE-3 layer and output layer; `feature_layers` says which target features it reads."""

    def __init__(self, config: LlamaConfig, *, feature_layers: Sequence[int], target_hidden: int | None = None,
                 qkv_bias: bool = False, fc_bias: bool = False, norm_before_residual: bool = False) -> None:
        super().__init__(config, qkv_bias=qkv_bias, fc_bias=fc_bias)
        h = self.config.hidden_size
        self.feature_layers = tuple(int(i) for i in feature_layers)
        self.target_hidden = int(target_hidden or h)
        self.norm_before_residual = bool(norm_before_residual)
        self.fc = nn.Linear(len(self.feature_layers) * self.target_hidden, h, bias=fc_bias)
        if self.fc.in_features == h:
            raise ModelLoadError("an EAGLE-3 head's fused target features must be wider than its hidden size "
                                 f"({len(self.feature_layers)} layer(s) x {self.target_hidden} = {h})")
        layer = self.layers[0]
        layer.input_layernorm = LlamaRMSNorm(h, eps=self.config.rms_norm_eps)    # EAGLE-3 keeps it, for the embedding
        layer.hidden_norm = LlamaRMSNorm(h, eps=self.config.rms_norm_eps)
        attn = layer.self_attn
        for name in ("q_proj", "k_proj", "v_proj"):                               # attention reads [emb ; g]: 2 x H
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(2 * h, old.out_features, bias=old.bias is not None))
        pass_cache_as(attn)
        self.norm = LlamaRMSNorm(h, eps=self.config.rms_norm_eps)
        vd = int(getattr(self.config, "draft_vocab_size", None) or self.config.vocab_size)
        self.lm_head = nn.Linear(h, vd, bias=False)

    # -------------------------------------------------------------------------- the layer
    def layer_input(self, emb: torch.Tensor, feat: torch.Tensor, fused: bool = True) -> torch.Tensor:
        """g [..., H]: fc(feat) for fused target features feat [..., 3 x H_target], else feat
        itself (the head's own outputs, [..., H], at draft depths >= 2); `emb` is read by `layer`."""
        g = feat.to(emb.dtype)
        return self.fc(g) if fused and g.shape[-1] == self.fc.in_features else g

    def attention_input(self, emb: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """What the attention projects: [input_norm(emb) ; hidden_norm(g)] [B, q, 2H]."""
        layer = self.layers[0]
        return torch.cat([layer.input_layernorm(emb), layer.hidden_norm(g)], dim=-1)

    def layer(self, emb: torch.Tensor, g: torch.Tensor, pos: torch.Tensor, cache, mask: torch.Tensor | None,
              cos_sin) -> torch.Tensor:
        """The EAGLE-3 layer over a batch: emb, g [B, q, H], pos [B, q] -> pre-norm outputs
        [B, q, H]; appends q rows per sequence to `cache`."""
        layer = self.layers[0]
        x = self.attention_input(emb, g)                                              # [B, q, 2H]
        residual = layer.hidden_norm(g) if self.norm_before_residual else g
        attn = layer.self_attn(x, position_embeddings=cos_sin, attention_mask=mask, cache=cache, position_ids=pos)
        h = residual + (attn[0] if isinstance(attn, tuple) else attn)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    # -------------------------------------------------------------------------- the output layer
    def _own_lm(self) -> LMHead:
        return LMHead(self.lm_head.weight, None, None)

    def eager_draft_logits(self, target: TargetModel, out: torch.Tensor) -> torch.Tensor:
        """out [q, H] -> logits [q, Vd] over the draft vocabulary (index i is draft_vocab[i], or
        target id i without d2t), through the head's own norm and lm_head."""
        return self._own_lm()(self.norm(out))

    def draft_output_layer(self, target: TargetModel):
        """eager_draft_logits as one callable (what CompiledHead traces): the head's norm, then its
        own lm_head rows."""
        lm = self._own_lm()
        return lambda out: lm(self.norm(out))

    def logits_over(self, target: TargetModel, out: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """out [r, H], ids [S] target ids inside the draft vocabulary -> logits [r, S]."""
        index = ids.to(self.lm_head.weight.device)
        if self.draft_vocab is not None:                         # target id -> its draft index
            values, order = torch.sort(self.draft_vocab.to(index.device))
            index = order[torch.searchsorted(values, index)]
        return self._own_lm().subset(index)(self.norm(out))


def _state_in(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Published keys -> this module's (`midlayer.` -> `layers.0.`); embeddings and t2d dropped."""
    out = {}
    for k, v in state.items():
        if k.startswith("embed_tokens") or k == "t2d" or k == "d2t":
            continue
        out["layers.0." + k[len("midlayer."):] if k.startswith("midlayer.") else k] = v
    return out


def eagle3_config(raw: dict, target: TargetModel) -> tuple[LlamaConfig, tuple[int, ...], int]:
    """The head's LlamaConfig, its target feature layers and the target's hidden size, from a
    published config.json; ModelLoadError where they do not fit `target`."""
    cfg = LlamaConfig(**{k: v for k, v in raw.items() if k in _HEAD_KEYS or k == "draft_vocab_size"})
    n_layers = int(getattr(target.model.config, "num_hidden_layers", 0) or 0)
    layers = raw.get("eagle_aux_hidden_state_layer_ids") or (raw.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids") or default_feature_layers(n_layers)
    layers = tuple(int(i) for i in layers)
    if n_layers and any(not 0 <= i < n_layers for i in layers):
        raise ModelLoadError(f"EAGLE-3 head reads target layers {list(layers)}, but the target has {n_layers}")
    target_hidden = int(raw.get("target_hidden_size") or cfg.hidden_size)
    if target_hidden != target.hidden_size:
        raise ModelLoadError(f"EAGLE-3 head expects target features of width {target_hidden}, "
                             f"but the target's hidden size is {target.hidden_size}")
    return cfg, layers, target_hidden


def build_eagle3_head(raw: dict, state: dict[str, torch.Tensor], target: TargetModel, where: str) -> Eagle3Head:
    """An Eagle3Head from a published config.json (`raw`) and weights (`state`); ModelLoadError on
    any mismatch, naming the first. The d2t draft vocabulary is checked by the caller."""
    cfg, layers, target_hidden = eagle3_config(raw, target)
    head = Eagle3Head(cfg, feature_layers=layers, target_hidden=target_hidden,
                      qkv_bias="midlayer.self_attn.q_proj.bias" in state, fc_bias="fc.bias" in state,
                      norm_before_residual=bool(raw.get("norm_before_residual", False)))
    return load_weights(head, _state_in(state), f"EAGLE-3 head at {where}")


def eagle3_state_and_config(head: Eagle3Head) -> tuple[dict[str, torch.Tensor], dict]:
    """The published layout of `head`: weights (midlayer.*, d2t and t2d) and config.json's content."""
    cfg = head_config(head, EAGLE3_ARCH)
    cfg.update({"target_hidden_size": head.target_hidden,
                "eagle_aux_hidden_state_layer_ids": list(head.feature_layers),
                "norm_before_residual": head.norm_before_residual,
                "draft_vocab_size": int(head.lm_head.weight.shape[0])})
    state = {}
    for k, v in head.state_dict().items():
        if k.startswith("rotary"):
            continue
        state["midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k] = v.detach().to("cpu").contiguous()
    vocab = head.draft_vocab if head.draft_vocab is not None else torch.arange(head.lm_head.weight.shape[0])
    vocab = vocab.detach().to("cpu").long()
    state["d2t"] = (vocab - torch.arange(vocab.numel())).contiguous()
    t2d = torch.zeros(int(head.config.vocab_size), dtype=torch.bool)
    t2d[vocab[vocab < t2d.numel()]] = True
    state["t2d"] = t2d
    return state, cfg


def random_eagle3_head(target: TargetModel, *, seed: int = 0, qkv_bias: bool = False,
                       draft_vocab: torch.Tensor | None = None,
                       feature_layers: Sequence[int] | None = None,
                       intermediate_size: int | None = None) -> Eagle3Head:
    """A randomly initialised EAGLE-3 head shaped for `target` (lossless, accepts little: for tests
    and as the start of training); `draft_vocab` [Vd] target ids, else the full vocabulary;
    `intermediate_size` its MLP's width (the target's when None)."""
    raw = {k: v for k, v in target.model.config.to_dict().items() if k in _HEAD_KEYS}
    if intermediate_size:
        raw["intermediate_size"] = intermediate_size
    n = target.vocab_size if draft_vocab is None else int(draft_vocab.numel())
    cfg = LlamaConfig(**{**raw, "draft_vocab_size": n})
    layers = tuple(feature_layers) if feature_layers is not None else \
        default_feature_layers(int(target.model.config.num_hidden_layers))
    head = seeded_init_(built_without_global_rng(
        lambda: Eagle3Head(cfg, feature_layers=layers, target_hidden=target.hidden_size, qkv_bias=qkv_bias)), seed)
    head.draft_vocab = None if draft_vocab is None else draft_vocab.long()
    return _to_target(head, target)
