"""scripts/gpu_check.py, the one command for a lent CUDA machine, runs its parts on the CPU with a
tiny speed model (the GPU run itself needs a machine this CI does not have): the environment guard,
tree forward and non-prefix keep, exactness, a model split over two (here: CPU) devices, the
verify-cost curve and the speeds, all written as JSON under the folder given on the command line."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"


def test_gpu_check_runs_on_cpu_with_a_tiny_model(tmp_path):
    out_dir = tmp_path / "gc"
    p = subprocess.run([sys.executable, str(SCRIPT), str(out_dir), "--device", "cpu", "--model", "tiny",
                        "--max-new-tokens", "12", "--split-devices", "cpu,cpu", "--prompts", "1"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads((out_dir / "gpu-check.json").read_text())
    assert report["ok"] and not any(part["error"] for part in report["parts"].values()), report["parts"]
    env = report["environment"]
    assert env["transformers_ok"] and env["cache_kwarg"]["LlamaModel"] == "cache"
    assert {(r["arch"], r["dtype"]) for r in report["tree_and_keep"]} == {
        (a, d) for a in ("llama", "qwen2") for d in ("float32", "float64")}
    assert all(r["ok"] for r in report["tree_and_keep"])
    assert len(report["exactness"]) == 16 and all(e["ok"] for e in report["exactness"])
    assert all(e["equal"] for e in report["exactness"] if e["dtype"] == "float64"), "float64 is exact"
    assert any(e["mean_accepted"] > 1.2 for e in report["exactness"]), "drafts must be accepted somewhere"
    assert report["split_devices"] and all(r["ok"] for r in report["split_devices"])
    assert set(report["verify_cost_ms"]) >= {"1", "8", "64"}
    assert report["summary"]["vanilla"]["speedup"] == 1.0
    strict = {m: s for m, s in report["summary"].items() if m != "respec"}     # respec relaxes retrieved drafts
    assert all(s["lossless"] == 1.0 for s in strict.values()), "strict methods are lossless"
    assert "PASS" in p.stdout


def test_gpu_check_refuses_a_wheel_it_cannot_install(tmp_path):
    bad = tmp_path / "transformers-0.0.0-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    p = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "gc"), "--device", "cpu",
                        "--transformers-wheel", str(bad)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "pip install of" in p.stderr and "Traceback" not in p.stderr
    assert "error" in json.loads((tmp_path / "gc" / "gpu-check.json").read_text())["wheel"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script would run")
def test_gpu_check_says_clearly_when_there_is_no_cuda(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "gc")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "CUDA is not available" in p.stderr and "Traceback" not in p.stderr
