"""The speed machinery is optional: with `respec.accel` unimportable (`sys.modules["respec.accel"] =
None`, as a deployment without it would be), the engine runs eagerly and the lossless suite passes.
Run in a fresh interpreter, so no module of this process has imported accel already."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BLOCKED = """
import sys
sys.modules["respec.accel"] = None
import torch
from respec.models.hf import HFTarget
from respec.models.tiny import tiny_llama
from respec.runner import Runner
target = HFTarget(tiny_llama(seed=0, dtype=torch.float64), eos_token_ids=frozenset({2}), context_length=256)
info = target.describe_forward()
assert not info.compiled and info.linear_layout == "" and target.linear_layouts is None, info
runner = Runner(target)                       # a random head, eager: nothing to settle or compile
assert runner.meta(runner.config(method="eagle2"))["forward"] == "eager"
try:
    target.enable_compile(progress=False)
except ValueError as exc:
    assert "respec.accel" in str(exc), exc
else:
    raise AssertionError("compiling without respec.accel must be refused in one line")
assert not any(name.startswith("respec.accel.") for name in sys.modules), "nothing of accel was imported"
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "tests/test_engine_lossless.py"]))
"""


def test_the_lossless_suite_passes_with_respec_accel_unimportable():
    done = subprocess.run([sys.executable, "-c", BLOCKED], cwd=ROOT, capture_output=True, text=True, timeout=1500)
    tail = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and " failed" not in done.stdout, tail
