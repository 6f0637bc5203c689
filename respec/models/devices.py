"""Where a model runs and in what dtype: device names, the dtype rule, and GPU placement.

Contract:
- `resolve_device(device)`: "auto" -> cuda if available, else cpu; "cpu", "cuda", "cuda:N", "mps" are checked
  against what this machine has. ConfigError for an unknown or absent device.
- `resolve_dtype(dtype, device, model_type)`: bf16 on GPUs with native bf16 (Ampere and later) and on CPUs with
  native bf16 (AVX512-BF16/AMX); fp16 on older GPUs (T4, V100: their bf16 is emulated), except the Qwen2 family,
  whose activations overflow fp16 (emulated bf16 there, else fp32); fp32 on other CPUs. fp32 is numerically sound
  for the default model (it matches fp64 to 1e-4 in the logits); bf16 is chosen for speed. See
  docs/MODEL_NOTES.md. ConfigError for an unknown dtype name, or fp16 asked for a Qwen2-family model.
- `device_map_for(config, dtype, device, spec)`: on CUDA, whole on the chosen GPU when it fits, else spread over
  every visible GPU (device_map="auto"); a model that would not fit on the GPUs together raises ModelLoadError
  before any weight is read (CPU/disk offload is refused; see respec/models/compat.py `check_placement`).
  None on CPU (load in place).
- `machine_summary(device)`: what a benchmark ran on (CPU model name, its cores, torch's threads,
  the instruction sets that decide bf16 speed, `ONEDNN_MAX_CPU_ISA`, the GPU's name), for a results
  folder's machine.json.

Pure functions over torch's view of the machine; nothing runs at import time, transformers is imported lazily.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from respec.errors import ConfigError, ModelLoadError
from respec.models.compat import transformers_quiet

DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp64": torch.float64, "float64": torch.float64, "double": torch.float64,
}


def is_dtype_setting(dtype: str | torch.dtype) -> bool:
    """True for "auto", a torch.dtype, or a name in DTYPES (case-insensitive): checked before any file is read."""
    return dtype == "auto" or isinstance(dtype, torch.dtype) or str(dtype).lower() in DTYPES


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """"auto" -> cuda if available, else cpu. Raises ConfigError for unknown or unavailable devices."""
    if isinstance(device, torch.device):
        dev = device
    elif device == "auto":
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise ConfigError(f"Unknown device {device!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'.") from error
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"Device {device!r} was asked for, but CUDA is not available here; use 'cpu' or 'auto'.")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"Device {device!r} does not exist: {torch.cuda.device_count()} CUDA device(s) visible.")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"Device {device!r} was asked for, but MPS is not available here.")
    return dev


_CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_tile", "bf16", "asimd")
_ENV = ("ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _cpu_info() -> tuple[str, set[str]]:
    """(model name, every flag) from /proc/cpuinfo (x86 "flags", Arm "Features"); where it cannot
    be read, platform.processor()'s name and no flags."""
    import platform
    name, flags = platform.processor(), set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                name = value.strip()
            elif key.strip() in ("flags", "Features"):
                flags.update(value.split())
    return name, flags


def machine_summary(device: torch.device) -> dict[str, Any]:
    """What a measurement ran on: CPU model name and flags, logical cores, torch's intra-op threads,
    the environment settings that change kernels or threads, torch's version, and for CUDA the GPU."""
    import os
    name, flags = _cpu_info()
    out: dict[str, Any] = {"cpu": name, "cpu_flags": [f for f in _CPU_FLAGS if f in flags],
                           "logical_cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                           "torch": torch.__version__, "env": {k: os.environ[k] for k in _ENV if k in os.environ}}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def cpu_supports_bf16() -> bool:
    """True when this CPU computes bf16 natively (x86 AVX512-BF16 or AMX, Arm BF16); emulated bf16 is slow."""
    for probe_name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        probe = getattr(torch.cpu, probe_name, None)  # private torch probes: present in 2.13, may move
        if probe is not None:
            with contextlib.suppress(Exception):
                if probe():
                    return True
    return bool(_cpu_info()[1] & {"avx512_bf16", "amx_bf16", "bf16"})


def resolve_dtype(dtype: str | torch.dtype, device: torch.device, model_type: str = "") -> torch.dtype:
    """Pick the parameter dtype.

    auto: CUDA -> bf16 where the GPU has it natively (compute capability 8.0+), else fp16 (T4, V100), but the
    Qwen2 family never gets fp16 (its activations overflow it; the EAGLE README says so too): emulated bf16
    where torch offers it, else fp32. CPU -> bf16 when native (cpu_supports_bf16), else fp32. Asking for fp16
    on a Qwen2-family model raises ConfigError.
    """
    qwen = model_type.lower().startswith("qwen")
    if isinstance(dtype, torch.dtype):
        chosen = dtype
    elif dtype == "auto":
        if device.type == "cuda":
            if torch.cuda.is_bf16_supported(including_emulation=False):
                chosen = torch.bfloat16
            elif not qwen:
                chosen = torch.float16
            else:
                chosen = torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=True) else torch.float32
        elif device.type == "cpu":
            chosen = torch.bfloat16 if cpu_supports_bf16() else torch.float32
        else:
            chosen = torch.float32
    elif isinstance(dtype, str) and dtype.lower() in DTYPES:
        chosen = DTYPES[dtype.lower()]
    else:
        raise ConfigError(f"Unknown dtype {dtype!r}: use 'auto', 'bf16', 'fp16', 'fp32' or 'fp64'.")
    if chosen == torch.float16 and qwen:
        raise ConfigError(
            f"fp16 is refused for {model_type} models: their activations overflow float16 and the output turns "
            "into garbage. Use dtype='bf16' (or 'fp32')."
        )
    return chosen



# ========================================================================================== placement ====

def estimated_bytes(config: Any, dtype: torch.dtype) -> int:
    """Parameter bytes of `config` in `dtype`, counted on the meta device (no memory is allocated)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"), transformers_quiet():
        skeleton = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in skeleton.parameters()) * torch.tensor([], dtype=dtype).element_size()


def needs_device_map(config: Any, dtype: torch.dtype, device: torch.device, spec: str = "the model") -> bool:
    """device_map="auto" (accelerate) only for CUDA and only when the weights do not fit on the chosen GPU;
    accelerate then spreads them over every visible GPU. A model that fits stays whole on one GPU: splitting a
    small model across GPUs only adds transfers. One that would not fit on all GPUs together raises
    ModelLoadError here, before any weight is read (CPU/disk offload is refused: see `check_placement`)."""
    if device.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(device)
    need = estimated_bytes(config, dtype)
    if need <= 0.9 * free:  # keep ~10% headroom for activations and the KV cache
        return False
    count = torch.cuda.device_count()
    total = sum(torch.cuda.mem_get_info(i)[0] for i in range(count))
    if need > 0.9 * total:
        raise ModelLoadError(
            f"{spec} needs about {need / 1e9:.1f} GB of weights in {str(dtype).removeprefix('torch.')}, but the "
            f"{count} visible GPU(s) have {total / 1e9:.1f} GB free together; offloading to the CPU is refused (every "
            "step would copy weights over). Use a GPU with more memory, more GPUs, or a smaller model.")
    return True


def device_map_for(config: Any, dtype: torch.dtype, device: torch.device, spec: str = "the model") -> str | dict | None:
    """The `device_map` for from_pretrained: None on CPU (load in place, then `.to(device)`), the chosen GPU when
    the weights fit there, "auto" (spread over every visible GPU) when they do not. Raises ModelLoadError when
    they would not fit on all GPUs together (see `needs_device_map`)."""
    if device.type != "cuda":
        return None
    whole = {"": device.index if device.index is not None else torch.cuda.current_device()}
    return "auto" if needs_device_map(config, dtype, device, spec) else whole
