"""Attention for tree verification and decoding, on the CPU and CUDA alike, through transformers' public AttentionInterface.

Contract: `use_tree_attention(model)` registers the attention function "respec_sdpa" (the same
function each time; the mask builder is transformers' own `sdpa_mask`) and switches a model that uses "sdpa"
to it. Every call that does not pass `respec_gqa=True` goes to transformers' `sdpa_attention_forward`
unchanged, so `model.generate` (the hf peers of the benchmark) runs exactly the stock code. The
engine's forwards (HFTarget.forward_tree: vanilla's steps and every method's steps alike) pass
`respec_gqa=True`; with grouped KV heads (g query heads per KV head), no dropout, position bias or
softcap, ONE packed path serves every device:
- the g query heads of each KV head are folded into its query rows ([B, H, q, D] ->
  [B, H_kv, g*q, D], head h = j*g + r reading KV head j, transformers' repeat_kv order), the
  mask [B, 1, q, k] is tiled g times along the rows, and plain SDPA runs over the KV heads as they
  are. Stock transformers copies every layer's keys and values to all query heads first whenever
  a mask is given (`repeat_kv`: ~55 MB per 16-node verify at an 800-token context on the default
  model; on CUDA a masked GQA call would also fall back to the math kernel), while vanilla's
  unmasked one-token step does not: tree methods would pay a copy of the whole cache per verify.
- one query (a decode step) is the same fold with q = 1. Stock transformers sends an unmasked
  single query to SDPA with `enable_gqa=True`, which in bfloat16 on the CPU is several times
  slower: a whole one-token step of the default model at a 2,048-token context took 99.7 ms that
  way against 63.8 ms packed (scripts/kv_attention_bench.py, BENCHMARKS.md §8). Vanilla decoding
  goes through this path too, so speedups are measured against the fast single-token step.
- several queries without a mask (the model's own causal flag) stay on the stock path (it then
  uses grouped SDPA without a copy).
Same maths up to float rounding (tests/test_kv_cache.py: the logits equal the stock path's in fp32).

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
    if (engine_call and groups > 1 and dropout == 0.0 and kwargs.get("position_bias") is None
            and kwargs.get("softcap") is None and (query.shape[2] == 1 or attention_mask is not None)):
        return packed_gqa(query, key, value, attention_mask, scaling, groups), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


def packed_gqa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
               scaling: float | None, groups: int) -> torch.Tensor:
    """query [B, H, q, D], key/value [B, H_kv, k, D], mask None or [B, 1, q, k] -> [B, q, H, D]: query
    head h = j * groups + r (repeat_kv's order) becomes rows r*q .. r*q + q - 1 of KV head j, and
    the mask is tiled `groups` times along the rows to match."""
    b, h, q, d = query.shape
    packed = query.reshape(b, h // groups, groups * q, d)                          # [B, H_kv, g*q, D]
    mask = None if attention_mask is None else attention_mask[:, :, :, :key.shape[-2]]   # as the stock path
    if mask is not None and q > 1:
        mask = mask.repeat(1, 1, groups, 1)                                        # [B, 1, g*q, k]
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask,
                                                           scale=scaling)         # [B, H_kv, g*q, D]
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous()


def _single_query(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, scaling: float | None, groups: int) -> torch.Tensor:
    """The packed path with one query: query [B, H, 1, D] -> [B, 1, H, D] (see `packed_gqa`)."""
    return packed_gqa(query, key, value, attention_mask, scaling, groups)


def use_tree_attention(model) -> bool:
    """Switch `model` from "sdpa" to "respec_sdpa" (see the module docstring). Returns whether
    `model` now runs it (also when an earlier call switched it: a second target over the same
    weights, HFTarget.twin)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if getattr(model.config, "_attn_implementation", None) == NAME:
        return True
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
