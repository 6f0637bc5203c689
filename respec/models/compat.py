"""What the installed transformers takes, and where a model's weights sit: checked once, loudly.

Contract:
- `cache_kwarg(fn)` names the keyword through which `fn` (a base model's or a decoder layer's
  forward) takes its KV cache: `cache` in transformers 5.24, `past_key_values` in older 5.x
  releases (5.17 among them). It reads the signature; a keyword a forward does not name would land
  in its `**kwargs` and be ignored, so every forward would silently start from an empty cache.
  Neither name -> one ModelLoadError.
- `pass_cache_as(module)` makes `module(..., cache=c)` reach a forward that calls it
  `past_key_values` (an instance-level shim, state_dict untouched); a no-op on 5.24.
- `check_transformers()` refuses a transformers older than MIN_TRANSFORMERS with one
  ModelLoadError naming the installed and the required version.
- `check_placement(model, name)` refuses a model with weights on the meta device, or dispatched by
  accelerate to the CPU or disk next to GPUs (offload): every forward would move weights per layer
  or feed meta tensors to the engine. One ModelLoadError says what to do instead.
- `cuda_devices(model)` lists the CUDA devices holding the model's weights (several under
  device_map="auto"): timing code synchronises every one of them.
- `transformers_quiet()` silences transformers' warnings and progress bars for a `with` block, then restores
  them (our own cache loads quietly; a user's model keeps transformers' warnings).
Nothing runs at import time.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import re
from collections.abc import Iterator
from typing import Any, Callable

import torch

from respec.errors import ModelLoadError

#: Oldest transformers this engine runs on; 5.24.0 is the version tested (requirements.txt).
MIN_TRANSFORMERS = (5, 0)
TESTED_TRANSFORMERS = "5.24.0"
CACHE_KWARGS = ("cache", "past_key_values")    # the 5.24 name first


def _version_tuple(text: str) -> tuple[int, ...]:
    """"5.17.0" -> (5, 17, 0); "5.0.0rc1" -> (5, 0, 0); leading numeric parts only."""
    match = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", text.strip())
    return tuple(int(g) for g in match.groups() if g is not None) if match else ()


def check_transformers(version: str | None = None) -> str:
    """The installed (or given) transformers version; ModelLoadError if older than MIN_TRANSFORMERS."""
    if version is None:
        import transformers
        version = transformers.__version__
    if _version_tuple(version) < MIN_TRANSFORMERS:
        need = ".".join(map(str, MIN_TRANSFORMERS))
        raise ModelLoadError(
            f"transformers {version} is too old for this engine (it needs >= {need}; tested with "
            f"{TESTED_TRANSFORMERS}): install `transformers=={TESTED_TRANSFORMERS}`.")
    return version


def cache_kwarg(fn: Callable[..., Any]) -> str:
    """'cache' or 'past_key_values': the KV-cache keyword `fn`'s signature names (decorators that
    keep __wrapped__ are seen through). Raises ModelLoadError if it names neither."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"cannot read the signature of {getattr(fn, '__qualname__', fn)!r} to find how it "
                             f"takes its KV cache: {exc}") from None
    for name in CACHE_KWARGS:
        if name in params:
            return name
    import transformers
    raise ModelLoadError(
        f"{getattr(fn, '__qualname__', fn)} (transformers {transformers.__version__}) takes its KV cache under "
        f"neither `cache` nor `past_key_values`; the engine would run every forward without its cache. Install "
        f"transformers=={TESTED_TRANSFORMERS}.")


def pass_cache_as(module: torch.nn.Module) -> str:
    """Let `module(..., cache=c)` work whatever the installed transformers calls the keyword; returns
    that name. On 5.24 (`cache`) the module is left as it is."""
    name = cache_kwarg(module.forward)
    if name != "cache" and not getattr(module.forward, "_respec_cache_shim", False):
        original = module.forward

        @functools.wraps(original)
        def forward(*args: Any, cache: Any = None, **kwargs: Any) -> Any:
            return original(*args, **{name: cache}, **kwargs)

        forward._respec_cache_shim = True           # type: ignore[attr-defined]
        forward.__signature__ = inspect.signature(original)   # type: ignore[attr-defined]
        module.forward = forward                    # instance attribute: nn.Module.__call__ uses it
    return name


# ------------------------------------------------------------------------------------- placement
def check_placement(model: torch.nn.Module, name: str = "the model") -> None:
    """ModelLoadError if any weight of `model` is on the meta device or was dispatched to the CPU or
    disk next to GPU weights (accelerate's offload). A model wholly on the CPU is fine."""
    device_map = getattr(model, "hf_device_map", None) or {}
    offloaded = sorted({str(v) for v in device_map.values() if str(v) in ("cpu", "disk")})
    on_gpu = any(str(v) not in ("cpu", "disk", "meta") for v in device_map.values())
    meta = [n for n, p in list(model.named_parameters()) + list(model.named_buffers()) if p.device.type == "meta"]
    if meta or (offloaded and on_gpu):
        where = (f"{len(meta)} tensors on the meta device (e.g. {meta[0]})" if meta
                 else f"modules offloaded to {' and '.join(offloaded)}")
        raise ModelLoadError(
            f"{name} does not fit on the GPU(s): accelerate placed {where}. The engine needs every weight on a "
            "GPU (offloaded layers would be copied over on every draft and verify step, and meta tensors hold no "
            "values). Use a GPU with more memory, more GPUs, a smaller dtype, or a smaller model.")


def cuda_devices(model: torch.nn.Module) -> tuple[torch.device, ...]:
    """The CUDA devices holding `model`'s parameters, in index order (empty on the CPU)."""
    devs = {p.device for p in model.parameters() if p.device.type == "cuda"}
    return tuple(sorted(devs, key=lambda d: d.index if d.index is not None else -1))


def synchronize(devices: tuple[torch.device, ...]) -> None:
    """Wait for every queued kernel on each of `devices` (no-op for an empty tuple)."""
    for dev in devices:
        torch.cuda.synchronize(dev)


@contextlib.contextmanager
def transformers_quiet() -> Iterator[None]:
    """Silence transformers' warnings and progress bars for the duration (restores the previous state)."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()
