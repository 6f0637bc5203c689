"""Tiny random-init targets built from a config (nothing downloaded), for tests and CI.

Contract: `tiny_llama` / `tiny_qwen2` return seeded, eval-mode models on CPU that work on token ids only and
know nothing about text. Same arguments -> bit-identical weights; the seed is applied inside a fork of the CPU
RNG, so the caller's global RNG state is left as it was. float64 by default: on CPU, a chain of one-token
decode steps and one batched tree forward then pick the same greedy tokens, so speculative and vanilla decoding
agree exactly (ARCHITECTURE.md §5, rule 19). `tiny_loaded` wraps one as a LoadedModel without a tokenizer.

Fixed conventions (tests rely on them): bos = 1, eos = 2, pad = 0; tie_word_embeddings False (the output head
is its own matrix, as in larger targets); attention "sdpa", the engine's default, which handles float64 and
custom 4D additive tree masks on CPU (tests/test_loading.py checks both).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch

from respec.models.loading import LoadedModel

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

BOS, EOS, PAD = 1, 2, 0


def _common(vocab_size: int, hidden_size: int, layers: int, heads: int, kv_heads: int, max_positions: int,
            intermediate_size: int | None) -> dict:
    if hidden_size % heads or heads % kv_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must divide by heads ({heads}), and heads by kv_heads ({kv_heads})")
    if vocab_size <= EOS:
        raise ValueError(f"vocab_size must exceed {EOS} (the eos id), got {vocab_size}")
    return dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size or 2 * hidden_size,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                max_position_embeddings=max_positions, tie_word_embeddings=False, bos_token_id=BOS,
                eos_token_id=EOS, pad_token_id=PAD, use_cache=True)


def _build(model_cls, config, seed: int, dtype: torch.dtype, logit_scale: float):
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    # Random init gives near-uniform logits; widen the output layer so greedy choices are decisive
    # (top-1/top-2 gaps far above float64 rounding) and acceptance patterns are non-trivial.
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    model = model.to(dtype).eval()
    model.requires_grad_(False)
    return model


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float64, vocab_size: int = 128, hidden_size: int = 64,
               layers: int = 2, heads: int = 4, kv_heads: int = 2, max_positions: int = 512,
               intermediate_size: int | None = None, logit_scale: float = 25.0) -> LlamaForCausalLM:
    """A random-init LlamaForCausalLM: `heads` query heads share `kv_heads` KV heads (GQA); MLP width
    `intermediate_size` (default 2 * hidden_size); lm_head weights multiplied by `logit_scale`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**_common(vocab_size, hidden_size, layers, heads, kv_heads, max_positions, intermediate_size))
    return _build(LlamaForCausalLM, cfg, seed, dtype, logit_scale)


def tiny_qwen2(seed: int = 0, dtype: torch.dtype = torch.float64, vocab_size: int = 128, hidden_size: int = 64,
               layers: int = 2, heads: int = 4, kv_heads: int = 2, max_positions: int = 512,
               intermediate_size: int | None = None, logit_scale: float = 25.0) -> Qwen2ForCausalLM:
    """A random-init Qwen2ForCausalLM (q/k/v projections carry a bias, unlike Llama's); arguments as tiny_llama."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**_common(vocab_size, hidden_size, layers, heads, kv_heads, max_positions, intermediate_size),
                      use_sliding_window=False)
    return _build(Qwen2ForCausalLM, cfg, seed, dtype, logit_scale)


def tiny_loaded(arch: Literal["llama", "qwen2"] = "llama", seed: int = 0, dtype: torch.dtype = torch.float64,
                **kwargs) -> LoadedModel:
    """A tiny model as a LoadedModel: tokenizer None, eos_token_ids {2}, on CPU. `kwargs` go to tiny_llama /
    tiny_qwen2 (vocab_size, hidden_size, layers, heads, kv_heads, max_positions, ...)."""
    builders = {"llama": tiny_llama, "qwen2": tiny_qwen2}
    if arch not in builders:
        raise ValueError(f"arch must be one of {sorted(builders)}, not {arch!r}")
    model = builders[arch](seed=seed, dtype=dtype, **kwargs)
    return LoadedModel(
        model=model,
        tokenizer=None,
        name=f"tiny-{arch}",
        source=f"random init ({arch}, seed={seed})",
        device=torch.device("cpu"),
        dtype=dtype,
        architecture=type(model).__name__,
        context_length=model.config.max_position_embeddings,
        eos_token_ids=frozenset({EOS}),
        origin="respec.models.tiny",
        spec=f"tiny-{arch}",
    )
