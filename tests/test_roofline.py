"""The roofline bound that scripts/verify_cost.py prints (respec/lab/roofline.py)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from respec.lab.roofline import MachineLimits, TargetProfile, forward_bound, measure_machine, target_profile
from tests.conftest import make_target

ROOT = Path(__file__).resolve().parent.parent


def test_the_bound_is_the_larger_of_memory_and_compute_time():
    prof = TargetProfile(weight_bytes=270_000_000, kv_bytes_per_token=100_000, flops_per_token=270_000_000,
                         attn_flops_per_ctx=10_000)
    lim = MachineLimits(bandwidth_gbs=20.0, matmul_gflops=100.0, dtype="bfloat16")
    one = forward_bound(prof, lim, n=1, context=255)
    # 270 MB + 256 x 100 kB = 295.6 MB at 20 GB/s = 14.78 ms; 1 x (0.27 GFLOP + 10k x 256) at 100 GFLOP/s
    assert one["memory_ms"] == pytest.approx(14.78)
    assert one["compute_ms"] == pytest.approx((270e6 + 10_000 * 256) / 100e9 * 1e3)
    assert one["bound_ms"] == one["memory_ms"]
    many = forward_bound(prof, lim, n=512, context=0)
    assert many["compute_ms"] > many["memory_ms"] and many["bound_ms"] == many["compute_ms"]
    assert "read_bound_ms" not in one                      # no read bandwidth measured: no read bound


def test_the_read_bound_moves_the_same_bytes_at_the_read_bandwidth():
    prof = TargetProfile(weight_bytes=270_000_000, kv_bytes_per_token=100_000, flops_per_token=270_000_000,
                         attn_flops_per_ctx=10_000)
    lim = MachineLimits(bandwidth_gbs=40.0, matmul_gflops=100.0, dtype="bfloat16", read_gbs=20.0)
    one = forward_bound(prof, lim, n=1, context=255)
    # 295.6 MB at 40 GB/s (copy) = 7.39 ms, at 20 GB/s (read) = 14.78 ms; compute 2.73 ms
    assert one["bound_ms"] == pytest.approx(7.39) and one["read_bound_ms"] == pytest.approx(14.78)
    many = forward_bound(prof, lim, n=512, context=0)
    assert many["read_bound_ms"] == many["compute_ms"] == many["bound_ms"]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_profile_counts_weights_once_and_the_keys_and_values_of_every_layer(arch):
    target = make_target(arch)
    prof = target_profile(target)
    cfg = target.model.config
    unique = {p.data_ptr(): p for p in target.model.parameters()}
    assert prof.weight_bytes == sum(p.numel() * p.element_size() for p in unique.values())
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert prof.kv_bytes_per_token == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 8   # fp64
    tied = target._embed.weight.data_ptr() == target._head.weight.data_ptr()
    n_params = sum(p.numel() for p in unique.values())
    assert prof.flops_per_token == 2 * (n_params if tied else n_params - target._embed.weight.numel())


def test_machine_limits_are_measured_positive_numbers():
    lim = measure_machine("cpu", torch.float32, copy_mib=8, matmul_n=128, rounds=2)
    assert lim.bandwidth_gbs > 0 and lim.read_gbs > 0 and lim.matmul_gflops > 0 and lim.dtype == "float32"
    assert lim.dtype_gflops == lim.matmul_gflops


def test_the_bound_takes_float32_throughput_where_the_dtypes_own_matmul_is_slower():
    """bf16 on a CPU without bf16 instructions (commit 671c23f of 2026-12-07: 0.3 GFLOP/s, a one-token bound of 940
    ms against a 20 ms forward): the arithmetic could run in float32, so the bound uses the faster
    of the two; the dtype's own rate is kept beside it. Which is faster is this machine's business."""
    lim = measure_machine("cpu", torch.bfloat16, copy_mib=8, matmul_n=128, rounds=2)
    assert lim.dtype == "bfloat16" and lim.dtype_gflops > 0 and lim.matmul_gflops >= lim.dtype_gflops
    from respec.lab import roofline
    rates = {torch.bfloat16: 0.3, torch.float32: 170.0}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(roofline, "_matmul_gflops", lambda device, dtype, *a, **k: rates[dtype])
        slow = measure_machine("cpu", torch.bfloat16, copy_mib=8, rounds=1)
        rates[torch.bfloat16] = 400.0
        native = measure_machine("cpu", torch.bfloat16, copy_mib=8, rounds=1)
    assert (slow.matmul_gflops, slow.dtype_gflops) == (170.0, 0.3)
    assert (native.matmul_gflops, native.dtype_gflops) == (400.0, 400.0)


def test_verify_cost_prints_the_bound_rows_for_a_measured_curve(capsys):
    spec = importlib.util.spec_from_file_location("verify_cost", ROOT / "scripts" / "verify_cost.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    target = make_target("llama", dtype=torch.float32)
    curve = target.verify_cost_curve(max_size=4, context=16, reps=1)
    script.print_bound(target, curve, 16)
    out = capsys.readouterr().out
    assert "memory bandwidth" in out
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in out.splitlines() if line.startswith("| ")}
    assert len(rows["bound ms"]) == len(curve) and all(float(v) > 0 for v in rows["x bound"])
    assert len(rows["read bound ms"]) == len(curve) and all(float(v) > 0 for v in rows["x read bound"])
