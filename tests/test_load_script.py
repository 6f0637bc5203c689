"""The bounded load script (scripts/load_test.py) on a small load: it starts the real app as a
server process on loopback, runs concurrent gradio_client clients and checks completion, no crossed
responses and FIFO order (memory only loosely here: one warm-up round does not settle the
allocator). docs/benchmarks-history.md records the full 8 x 3 run with its memory figures."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_load_script_passes_on_a_small_load(tmp_path):
    from respec.models.default_model import default_cache_dir
    if not (default_cache_dir() / "config.json").is_file():
        pytest.skip("the default model is not in the local cache (run scripts/setup.sh)")
    out = tmp_path / "load.json"
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "load_test.py"), "--clients", "3",
                        "--requests-per-client", "2", "--max-new-tokens", "6", "--warmup-rounds", "1", "--memory-slack-mb", "200", "--out", str(out),
                        "--timeout", "600"], capture_output=True, text=True, timeout=700, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ok"] and report["completed"] == report["requests"] == 6
    assert not report["errors"] and not report["crossed"] and not report["fifo_violations"]
    assert all(r["respec_tokens"] > 0 for r in report["requests_detail"]), "every response carries its own tokens"


def test_load_script_refuses_unbounded_loads():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "load_test.py"), "--clients", "500"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "bounds" in p.stderr
