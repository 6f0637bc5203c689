"""The `spaces.GPU` shim (UX.md §5.3): on a ZeroGPU Space `gpu(...)` is `spaces.GPU`, which attaches
a GPU for the duration of the decorated call (generators included); everywhere else (local, CPU
Space, CI, `spaces` not installed or `SPACES_ZERO_GPU` unset) it returns the function unchanged.

Usage: `@gpu` or `@gpu(duration=120)`.
"""
from __future__ import annotations

import os
from typing import Any, Callable

try:  # pragma: no cover - depends on the deployment
    import spaces as _spaces
except ImportError:  # local / CPU Space / CI
    _spaces = None

#: True on a ZeroGPU Space (the only place where `spaces.GPU` does anything).
ZERO_GPU = bool(os.environ.get("SPACES_ZERO_GPU")) and _spaces is not None


def gpu(fn: Callable | None = None, **kwargs: Any):
    """`spaces.GPU` when the package is importable, else a no-op decorator (with or without arguments)."""
    if _spaces is not None:
        return _spaces.GPU(fn, **kwargs) if fn is not None else _spaces.GPU(**kwargs)
    if fn is not None:
        return fn
    return lambda f: f
