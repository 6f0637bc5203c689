"""ReSpec Explorer engine: speculative decoding (vanilla, EAGLE-2, SAM-Decoding, ReSpec) over HF
causal LMs, with per-step traces as first-class data.

Importing this package does no work (no model loading, no environment changes). Public API:
`load_target`, `EngineConfig`, `Engine`, `make_drafter`, `DraftTree`, `Verdict`, trace I/O (the
names below), and the modules of PUBLIC_MODULES: `respec.runner` (Runner, ModelChoice, the run
stream, release_memory), `respec.models` (load_target), `respec.config`, `respec.errors`,
`respec.trace`, `respec.tokens`, `respec.anatomy`, and the lab's `respec.lab.bench` and
`respec.lab.sweep`. The app (app/) imports nothing else of respec (tests/test_code_shape.py).

Rooms (imports point one way: lab -> runner -> engine / drafters -> models; accel/ is used by the
models/ adapters and the runner only, and the algorithm runs eagerly without it):
- the algorithm: engine, tree, verify, sampling, tokens, cost, config, errors, trace, anatomy,
  transfer, memory, prompting; drafters/ (heads/: the EAGLE heads and their checkpoints);
  retrieval/;
- composition: runner, cli; models/ (targets, loading, the HF adapter);
- accel/: what makes a forward faster on a given machine (compile, graph choice, linear layouts,
  the head's compile, the collector's settling, the speed variables);
- lab/: bench, reports, questions, sweeps, the roofline; train/: EAGLE head training.
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

PUBLIC_MODULES = ("respec", "respec.runner", "respec.models", "respec.config", "respec.errors", "respec.trace",
                  "respec.tokens", "respec.anatomy", "respec.lab.bench", "respec.lab.sweep")


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'respec' has no attribute {name!r}")
