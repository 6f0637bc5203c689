"""Attention for tree verification and decoding on the CPU, through transformers' public AttentionInterface.

Contract: `use_tree_attention(model)` registers the attention function "respec_sdpa" (the same
function each time; the mask builder is transformers' own `sdpa_mask`) and switches a model that uses "sdpa"
to it. Every call that does not pass `respec_gqa=True` goes to transformers' `sdpa_attention_forward`
unchanged, so `model.generate` (the hf peers of the benchmark) runs exactly the stock code. The
engine's forwards (HFTarget.forward_tree: vanilla's steps and every method's steps alike) pass
`respec_gqa=True`; on the CPU, with grouped KV heads, no dropout, position bias or softcap:
- more than one query under a mask (a draft tree or chain) calls torch's SDPA with `enable_gqa=True`.
  Stock transformers only does that without a mask and otherwise copies every layer's keys and values
  to all query heads first (`repeat_kv`: ~55 MB per 16-node verify at an 800-token context on the
  default model);
- one query (a decode step) is packed as the `g` queries of each KV head ([B, H_kv, g, D]) and
  attends without `enable_gqa`. Stock transformers sends an unmasked single query to SDPA with
  `enable_gqa=True`, which in bfloat16 on the CPU is several times slower (float32 is about the
  same either way): a whole one-token step of the default model at a 2,048-token context took
  99.7 ms that way against 63.8 ms packed (scripts/kv_attention_bench.py, BENCHMARKS.md §8), more
  than a two-token tree. Vanilla decoding goes through this path too, so speedups are measured
  against the fast single-token step.
Same maths (bit-identical logits for the tree path, tests/test_kv_cache.py; float rounding for the
packed path). On CUDA a masked GQA call would fall back to torch's math kernel, so there the stock
path is kept.

`additive_mask(blocked, past, dtype)` is the one bool -> additive mask conversion (tree verification
in hf.py, the EAGLE head's causal and tree masks in respec/drafters/).
"""
from __future__ import annotations

import torch

NAME = "respec_sdpa"


def respec_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query [B, H, q, D], key/value [B, H_kv, k, D], mask [B, 1, q, k] -> ([B, q, H, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    engine_call = kwargs.pop("respec_gqa", False)
    groups = getattr(module, "num_key_value_groups", 1)
    if (engine_call and query.device.type == "cpu" and groups > 1 and dropout == 0.0
            and kwargs.get("position_bias") is None and kwargs.get("softcap") is None):
        if query.shape[2] == 1:
            return _single_query(query, key, value, attention_mask, scaling, groups), None
        if attention_mask is not None:
            out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                                   scale=scaling, enable_gqa=True)
            return out.transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def _single_query(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, scaling: float | None, groups: int) -> torch.Tensor:
    """query [B, H, 1, D], key/value [B, H_kv, k, D], mask None or [B, 1, 1, k] -> [B, 1, H, D]: query
    head h = j * groups + r (repeat_kv's order) becomes query r of KV head j."""
    b, h, _, d = query.shape
    packed = query.reshape(b, h // groups, groups, d)                             # [B, H_kv, g, D]
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=attention_mask,
                                                           scale=scaling)         # [B, H_kv, g, D]
    return out.reshape(b, h, 1, d).transpose(1, 2).contiguous()


def use_tree_attention(model) -> bool:
    """Switch `model` from "sdpa" to "respec_sdpa" (see the module docstring). Returns whether it did."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if getattr(model.config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    AttentionInterface.register(NAME, respec_sdpa)           # idempotent: the same function each time
    AttentionMaskInterface.register(NAME, sdpa_mask)
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, ImportError):       # a model class that refuses custom attention keeps sdpa
        return False
    return True


def additive_mask(blocked: torch.Tensor, past: int, dtype: torch.dtype) -> torch.Tensor:
    """blocked [q, m] bool (True: may not attend) over the last m of past + m key positions ->
    additive mask [1, 1, q, past + m] in `dtype` on blocked's device: 0 where attending is allowed
    (all of the first `past` positions), the dtype's minimum where blocked."""
    q, m = blocked.shape
    mask = torch.zeros(1, 1, q, past + m, dtype=dtype, device=blocked.device)
    mask[0, 0, :, past:].masked_fill_(blocked, torch.finfo(dtype).min)
    return mask
