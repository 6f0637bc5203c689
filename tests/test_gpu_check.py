"""scripts/gpu_check.py, the one command for a lent CUDA machine, runs its three parts on the CPU
with a tiny speed model (the GPU run itself needs a machine this CI does not have)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"


def test_gpu_check_runs_on_cpu_with_a_tiny_model(tmp_path):
    out = tmp_path / "gc.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--model", "tiny", "--max-new-tokens", "12",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["ok"] and len(report["exactness"]) == 24 and all(e["equal"] for e in report["exactness"])
    assert set(report["verify_cost_ms"]) >= {"1", "8", "64"}
    assert report["summary"]["vanilla"]["speedup"] == 1.0
    strict = {m: s for m, s in report["summary"].items() if m != "respec"}     # respec relaxes retrieved drafts
    assert all(s["lossless"] == 1.0 for s in strict.values()), "strict methods are lossless"
    assert "PASS" in p.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script would run")
def test_gpu_check_says_clearly_when_there_is_no_cuda():
    p = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "CUDA is not available" in p.stderr and "Traceback" not in p.stderr
