"""scripts/gpu_check.py, the one command for a lent CUDA machine, runs its parts on the CPU with tiny
models (the GPU run itself needs a machine this CI does not have): from the repository alone with only
the packages a GPU image ships (gradio, pandas, plotly, psutil, gguf blocked), one JSON report and
nothing else under the output folder, the environment guard, tree forward and non-prefix keep, bf16 and
fp32 lossless checks on GQA and MHA models, a model split over two (here: CPU) devices, round trips per
EAGLE step, the verify-cost curve per context length and tokens/s of every method; a missing package
is one line, and a carried wheel is installed outside the output folder."""
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.py"
#: packages of the project that a lent GPU machine does not have
NOT_ON_THE_MACHINE = ("gradio", "gradio_client", "pandas", "plotly", "gguf", "arctic_inference", "playwright")


def _run_blocked(args: list[str], blocked=NOT_ON_THE_MACHINE, cwd=None, timeout=600,
                 script: Path = SCRIPT) -> subprocess.CompletedProcess:
    """`script` under this Python with `blocked` packages unimportable, from another folder."""
    boot = ("import sys, runpy, importlib.util\n"
            f"BLOCKED = {tuple(blocked)!r}\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in BLOCKED:\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "real_find_spec = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda name, package=None: (\n"
            "    None if name.split('.')[0] in BLOCKED else real_find_spec(name, package))\n"
            f"sys.argv = [{str(script)!r}] + sys.argv[1:]\n"
            f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    return subprocess.run([sys.executable, "-c", boot, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd or tempfile.gettempdir())


def test_gpu_check_runs_on_cpu_with_only_the_machines_packages(tmp_path):
    out_dir = tmp_path / "gc"
    p = _run_blocked([str(out_dir), "--device", "cpu", "--speed-model", "tiny", "--max-new-tokens", "12",
                      "--split-devices", "cpu,cpu", "--prompts", "1", "--no-default-model"])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert [f.name for f in out_dir.rglob("*")] == ["gpu-check.json"], "one report, nothing else"
    report = json.loads((out_dir / "gpu-check.json").read_text())
    assert report["ok"] and not any(part["error"] for part in report["parts"].values()), report["parts"]
    env = report["environment"]
    import transformers
    assert env["transformers"] == transformers.__version__ and env["transformers_ok"]
    assert env["cache_kwarg"]["LlamaModel"] in ("cache", "past_key_values")
    assert {(r["arch"], r["dtype"]) for r in report["tree_and_keep"]} == {
        (a, d) for a in ("llama", "qwen2") for d in ("float32", "float64")}
    rows = report["lossless"]
    assert {(r["model"], r["dtype"]) for r in rows} == {
        (m, d) for m in ("llama-gqa", "llama-mha", "qwen2-gqa") for d in ("bfloat16", "float32")}
    assert all(r["ok"] for r in rows) and len(rows) == 24
    assert all(r["trees_verified"] > 0 for r in rows if r["method"] == "eagle2"), "bf16 and fp32 trees verified"
    assert {r["dtype"] for r in report["split_devices"]} == {"bfloat16", "float32"}
    assert all(r["ok"] for r in report["split_devices"])
    trips = report["round_trips"]
    assert trips["ok"] and trips["eagle_steps"] > 0 and trips["max_per_eagle_step"] <= 12
    assert set(report["verify_cost_ms"]) == {"128"} and set(report["verify_cost_ms"]["128"]) >= {"1", "8", "64"}
    summary = report["summary"]
    assert {"vanilla", "eagle2", "sam", "respec", "respec-strict", "hf-greedy", "hf-pld"} <= set(summary)
    assert "suffix" not in summary, "arctic-inference is blocked here: suffix is left out, not an error"
    assert summary["vanilla"]["speedup"] == 1.0
    assert all(s["lossless"] == 1.0 for m, s in summary.items() if m != "respec"), "strict methods are lossless"
    assert "PASS" in p.stdout


def test_a_missing_package_is_one_line_before_anything_runs(tmp_path):
    p = _run_blocked([str(tmp_path / "gc"), "--device", "cpu"], blocked=("accelerate", "gradio"), timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "missing: accelerate" in lines[0], lines
    assert json.loads((tmp_path / "gc" / "gpu-check.json").read_text())["missing"] == ["accelerate"]


def _wheel(path: Path, package: str) -> Path:
    """A minimal pure-Python wheel of `package` (one module) for pip."""
    whl = path / f"{package}-0.1-py3-none-any.whl"
    dist = f"{package}-0.1.dist-info"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr(f"{package}/__init__.py", "VALUE = 42\n")
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
        z.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{dist}/RECORD", "")
    return whl


def test_a_carried_wheel_is_installed_outside_the_output_folder(tmp_path, monkeypatch):
    import importlib.util
    spec = importlib.util.spec_from_file_location("gpu_check_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(sys, "path", list(sys.path))
    site = Path(script.install_wheel(str(_wheel(tmp_path, "respec_wheel_probe"))))
    try:
        assert tmp_path not in site.parents and site.is_dir(), site
        assert (site / "respec_wheel_probe" / "__init__.py").is_file() and sys.path[0] == str(site)
    finally:
        import shutil
        shutil.rmtree(site, ignore_errors=True)


def test_gpu_check_refuses_a_wheel_it_cannot_install(tmp_path):
    bad = tmp_path / "transformers-0.0.0-py3-none-any.whl"
    bad.write_bytes(b"not a zip")
    p = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "gc"), "--device", "cpu",
                        "--transformers-wheel", str(bad)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "pip install of" in p.stderr and "Traceback" not in p.stderr
    assert "error" in json.loads((tmp_path / "gc" / "gpu-check.json").read_text())["wheel"]
    assert [f.name for f in (tmp_path / "gc").iterdir()] == ["gpu-check.json"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script would run")
def test_gpu_check_says_clearly_when_there_is_no_cuda(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "gc")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "CUDA is not available" in p.stderr and "Traceback" not in p.stderr


def _test_tools() -> tuple[str, ...]:
    """The test tools (requirements-dev.txt), which README's first command alone does not install;
    httpx only where huggingface_hub does not need it (1.x depends on it, as on a lent GPU machine
    with transformers 5.17; 2.x moved to httpx2)."""
    import huggingface_hub
    hub_needs_httpx = int(huggingface_hub.__version__.split(".")[0]) == 1
    return ("pytest", "_pytest", "hypothesis", "playwright") + (() if hub_needs_httpx else ("httpx",))


TEST_TOOLS = _test_tools()


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").glob("*.py")))
def test_every_script_answers_help_without_the_test_tools(script):
    p = _run_blocked(["--help"], blocked=TEST_TOOLS, cwd=str(ROOT), timeout=300, script=ROOT / "scripts" / script)
    assert p.returncode == 0 and "usage" in p.stdout.lower(), (p.stdout[-800:], p.stderr[-1500:])
