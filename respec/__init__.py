"""ReSpec Explorer engine: speculative decoding (vanilla, EAGLE-2, SAM-Decoding, ReSpec) over HF
causal LMs, with per-step traces as first-class data.

Importing this package does no work (no model loading, no environment changes). Public API:
`load_target`, `EngineConfig`, `Engine`, `make_drafter`, `DraftTree`, `Verdict`, trace I/O.
"""
from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "EngineConfig": ("respec.config", "EngineConfig"),
    "Engine": ("respec.engine", "Engine"),
    "make_drafter": ("respec.drafters", "make_drafter"),
    "DraftTree": ("respec.tree", "DraftTree"),
    "Verdict": ("respec.verify", "Verdict"),
    "load_target": ("respec.models", "load_target"),
    "GenerationResult": ("respec.trace", "GenerationResult"),
    "result_to_json": ("respec.trace", "result_to_json"),
    "result_from_json": ("respec.trace", "result_from_json"),
    "RespecError": ("respec.errors", "RespecError"),
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'respec' has no attribute {name!r}")
