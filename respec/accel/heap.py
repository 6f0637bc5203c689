"""A process's long-lived objects (models, compiled graphs) kept out of the garbage collector's passes.

Contract:
- `settle()`: one full collection now, then `gc.freeze()`: every object alive moves into the
  collector's permanent generation, which later collections never traverse. Called where a model
  has just been loaded or compiled, outside any request's timing: at the end of `Runner.__init__`
  (after the head's compile when the target came compiled), of `Runner._compile_in_place`, and
  where a background compile installs its graphs (respec/runner.py).
- `release()`: `gc.unfreeze()`, before a model is dropped (the app's model switch), so the old
  model's reference cycles are collectable again; the next `settle()` freezes what is alive then.
Refcounting frees frozen objects as usual; only cyclic garbage among them waits for `release()`.

Why: a full (generation-2) pass traverses every tracked object and runs whenever enough young
objects have survived, so it lands inside some request at random. The default model loaded eagerly
with its head holds ~370k tracked objects (a full pass 181 ms); compiling the head alone takes it to
~681k (454 ms), and a compiled target holds more (2-core AMD EPYC Zen 4, commit 1afb074 of 2026-12-06, a throwaway
census). In a compiled bench one respec request's prefill took 2,082 ms against 757-849 ms in every
other run of that question (`bench-out/2026-12-06-1afb074-compiled`, q481), and the eager bench logged full passes
of up to 215 ms. Nothing happens at import.
"""
from __future__ import annotations

import gc


def settle() -> None:
    """Collect once, then freeze every object alive (see the module docstring)."""
    gc.collect()
    gc.freeze()


def release() -> None:
    """Unfreeze: objects frozen by `settle` are traversed (and their cycles collectable) again."""
    gc.unfreeze()
