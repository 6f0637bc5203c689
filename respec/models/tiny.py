"""Tiny random-init targets built from a config (nothing downloaded), for tests and CI.

Contract: `tiny_llama` / `tiny_qwen2` return seeded, eval-mode models (float64 by default, so
speculative and vanilla decoding agree exactly on CPU) that work on token ids only. `tiny_loaded`
wraps one as a LoadedModel without a tokenizer.
"""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM


def _common(vocab_size: int, hidden_size: int, layers: int, heads: int, kv_heads: int, max_positions: int) -> dict:
    return dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                max_position_embeddings=max_positions, tie_word_embeddings=False, bos_token_id=1,
                eos_token_id=2, pad_token_id=0)


def _build(model_cls, config, seed: int, dtype: torch.dtype):
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = model_cls(config)
    # Random init gives near-uniform logits; widen the output layer so greedy choices are decisive
    # (top-1/top-2 gaps far above float64 rounding) and acceptance patterns are non-trivial.
    with torch.no_grad():
        model.lm_head.weight.mul_(25.0)
    return model.to(dtype).eval()


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float64, vocab_size: int = 128, hidden_size: int = 64,
               layers: int = 2, heads: int = 4, kv_heads: int = 2, max_positions: int = 512) -> LlamaForCausalLM:
    cfg = LlamaConfig(**_common(vocab_size, hidden_size, layers, heads, kv_heads, max_positions))
    return _build(LlamaForCausalLM, cfg, seed, dtype)


def tiny_qwen2(seed: int = 0, dtype: torch.dtype = torch.float64, vocab_size: int = 128, hidden_size: int = 64,
               layers: int = 2, heads: int = 4, kv_heads: int = 2, max_positions: int = 512) -> Qwen2ForCausalLM:
    cfg = Qwen2Config(**_common(vocab_size, hidden_size, layers, heads, kv_heads, max_positions))
    return _build(Qwen2ForCausalLM, cfg, seed, dtype)
