"""How far a target forward is from what the machine can physically do (issue 31, "Know the limit").

Contract:
- `measure_machine(device, dtype)` times three torch operations for a few seconds and returns a
  `MachineLimits`: memory bandwidth (a large tensor copy, bytes read + written per second, the
  fastest of several rounds), read bandwidth (the same tensor summed: bytes read per second, the
  traffic of a forward, which reads its weights and writes next to nothing) and matmul throughput
  in `dtype` (a square matmul large enough to be compute-bound, FLOP/s, the fastest of several
  rounds; sized down where the dtype runs slowly, so a round stays well under a second), or
  float32's where that is faster: the arithmetic a forward could do on this machine (a CPU
  without bf16 instructions computes bf16 in float32 anyway; on a 2-core AMD EPYC Zen 3, session
  41, torch's bf16 matmul ran at 0.3 GFLOP/s, which made the bound of a one-token forward 940 ms
  against the 20 ms it took). Which bandwidth is lower depends on the machine and the moment: on a 2-core AMD EPYC
  Zen 4 VM (commit dca698b of 2026-12-06) one throwaway run gave a copy 34.2 GB/s and a sum 31.2 GB/s (the compiled
  one-token forward's GEMVs then ran at 28-35 GB/s each), and `scripts/verify_cost.py` an hour
  later 51.3 and 54.4 GB/s.
- `forward_bound(model_bytes, kv_bytes_per_token, flops_per_token, ...)` is a pure function: the
  roofline time of one forward of n new tokens after `context` cached ones = max(bytes moved /
  bandwidth, FLOPs / throughput), where bytes moved = every weight once + the cached keys/values
  once, and FLOPs = 2 x the parameters a token passes through (the output layer included) + the
  attention's 4 x context x hidden per layer.
- `target_profile(target)` reads those three figures off a loaded HFTarget's model and config.
Nothing is measured at import.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MachineLimits:
    bandwidth_gbs: float        # GB/s of a large copy, read + write counted
    matmul_gflops: float        # GFLOP/s of a large square matmul: `dtype`'s, or float32's where faster
    dtype: str
    read_gbs: float = 0.0       # GB/s of a large tensor summed (read only); 0: not measured
    dtype_gflops: float = 0.0   # `dtype`'s own matmul GFLOP/s (matmul_gflops unless float32 ran faster)


@dataclass(frozen=True)
class TargetProfile:
    weight_bytes: int           # every parameter once (a tied embedding/output matrix counted once)
    kv_bytes_per_token: int     # keys + values of one cached position over all layers
    flops_per_token: int        # 2 x parameters on a token's path (embedding lookup excluded, output layer included)
    attn_flops_per_ctx: int     # per new token, per cached position: 4 x heads x head_dim x layers


def _fastest(fn, rounds: int) -> float:
    fn()                                        # warm-up (allocation, kernel selection)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_machine(device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16,
                    copy_mib: int = 512, matmul_n: int = 2048, rounds: int = 5) -> MachineLimits:
    """Bandwidth and matmul throughput of this machine, measured now (a few seconds)."""
    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    src = torch.ones(copy_mib * 2 ** 18, dtype=torch.float32, device=device)      # copy_mib MiB
    dst = torch.empty_like(src)

    def copy():
        dst.copy_(src)
        sync()

    def read():
        src.sum()
        sync()

    t_copy = _fastest(copy, rounds)
    t_read = _fastest(read, rounds)
    nbytes = src.numel() * src.element_size()
    own = _matmul_gflops(device, dtype, matmul_n, rounds, sync)
    fp32 = own if dtype == torch.float32 else _matmul_gflops(device, torch.float32, matmul_n, rounds, sync)
    return MachineLimits(bandwidth_gbs=2 * nbytes / t_copy / 1e9, matmul_gflops=max(own, fp32),
                         dtype=str(dtype).replace("torch.", ""), read_gbs=nbytes / t_read / 1e9, dtype_gflops=own)


def _matmul_gflops(device: torch.device, dtype: torch.dtype, n: int, rounds: int, sync,
                   budget_s: float = 0.25) -> float:
    """GFLOP/s of an n x n x n matmul in `dtype` (the fastest of `rounds`), n halved until a 256-wide
    probe says one call takes under `budget_s`."""
    def rate(size: int, reps: int) -> float:
        a = torch.randn(size, size, device=device).to(dtype)
        b = torch.randn(size, size, device=device).to(dtype)

        def mm():
            torch.mm(a, b)
            sync()
        return 2 * size ** 3 / _fastest(mm, reps) / 1e9

    probe = rate(min(256, n), 1)
    while n > 256 and 2 * n ** 3 / (probe * 1e9) > budget_s:
        n //= 2
    return max(probe, rate(n, rounds))


def target_profile(target) -> TargetProfile:
    """The byte and FLOP counts of `target` (an HFTarget) that `forward_bound` needs."""
    model, cfg = target.model, target.model.config
    params = list(model.parameters())                     # parameters() yields a tied matrix once
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    embed = target._embed.weight
    out = target._head.weight
    tied = embed.data_ptr() == out.data_ptr()
    # a token passes through every parameter except the embedding table (a lookup), but through the
    # output matrix: with tied weights that is the same count; untied, drop the embedding table
    flop_params = sum(p.numel() for p in params) - (0 if tied else embed.numel())
    layers = int(cfg.num_hidden_layers)
    heads = int(cfg.num_attention_heads)
    kv_heads = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    elt = embed.element_size()
    return TargetProfile(weight_bytes=weight_bytes, kv_bytes_per_token=2 * layers * kv_heads * head_dim * elt,
                         flops_per_token=2 * flop_params, attn_flops_per_ctx=4 * heads * head_dim * layers)


def forward_bound(profile: TargetProfile, limits: MachineLimits, n: int, context: int) -> dict[str, float]:
    """Roofline milliseconds of one forward of n new tokens after `context` cached ones:
    {"memory_ms", "compute_ms", "bound_ms" (the larger)}, at the copy bandwidth; with a measured
    read bandwidth also "read_memory_ms" and "read_bound_ms", the same bytes at that rate."""
    moved = profile.weight_bytes + profile.kv_bytes_per_token * (context + n)
    flops = n * (profile.flops_per_token + profile.attn_flops_per_ctx * (context + n))
    memory_ms = moved / (limits.bandwidth_gbs * 1e9) * 1e3
    compute_ms = flops / (limits.matmul_gflops * 1e9) * 1e3
    out = {"memory_ms": memory_ms, "compute_ms": compute_ms, "bound_ms": max(memory_ms, compute_ms)}
    if limits.read_gbs > 0:
        out["read_memory_ms"] = moved / (limits.read_gbs * 1e9) * 1e3
        out["read_bound_ms"] = max(out["read_memory_ms"], compute_ms)
    return out
