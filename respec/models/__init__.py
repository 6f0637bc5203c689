"""Target models: loading (`load_target`, respec/models/loading.py) and the HF adapter behind the
TargetModel seam (respec/models/base.py, respec/models/hf.py).

Importing this package loads nothing heavy: `load_target` is looked up on first use (as the
`respec` package does with its public names), so `respec.models.base` and the small modules stay
importable without transformers' model code.
"""
from __future__ import annotations

from respec.models.base import ForwardInfo, TargetModel, TargetOutput

_LAZY = {"load_target": ("respec.models.loading", "load_target")}

__all__ = ["ForwardInfo", "TargetModel", "TargetOutput", "load_target"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'respec.models' has no attribute {name!r}")
