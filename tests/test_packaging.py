"""Packaging facts a Hugging Face Space and a fresh clone rely on: requirements.txt is runtime-only (what a Space
installs), README's front-matter sdk_version equals the pinned gradio, requirements-dev.txt builds on the runtime
set, and pyproject.toml ships the packages and their data files."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")    # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
DEV_ONLY = ("pytest", "hypothesis", "playwright")


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            name, _, version = line.partition("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def test_requirements_are_runtime_only_and_gradio_matches_the_space_sdk():
    runtime = _pins(ROOT / "requirements.txt")
    assert not [name for name in DEV_ONLY if name in runtime], "test tools belong in requirements-dev.txt"
    front = (ROOT / "README.md").read_text().split("---")[1]
    sdk = re.search(r"^sdk_version:\s*(\S+)", front, re.M)
    assert sdk and sdk.group(1) == runtime["gradio"], "README's sdk_version must equal the pinned gradio"


def test_dev_requirements_add_the_test_tools_to_the_runtime_set():
    text = (ROOT / "requirements-dev.txt").read_text()
    assert "-r requirements.txt" in text.splitlines()
    assert set(DEV_ONLY) <= set(_pins(ROOT / "requirements-dev.txt"))


def test_pyproject_installs_the_packages_with_their_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert config["build-system"]["build-backend"] == "setuptools.build_meta"
    setuptools = config["tool"]["setuptools"]
    assert setuptools["dynamic"]["dependencies"]["file"] == ["requirements.txt"]
    assert set(setuptools["packages"]["find"]["include"]) == {"respec*", "app*"}
    for package, patterns in setuptools["package-data"].items():
        for pattern in patterns:
            if "*" not in pattern:
                assert (ROOT / package.replace(".", "/") / pattern).is_file(), f"{package}: {pattern} is missing"


SCRIPTS = sorted(p.name for p in (Path(__file__).resolve().parent.parent / "scripts").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_answers_help_with_the_runtime_requirements_alone(script):
    """README's first command installs requirements.txt only: `scripts/X.py --help` must not need a
    test tool (the dev requirements' playwright, pytest, hypothesis are made unimportable here)."""
    import subprocess
    import sys
    root = Path(__file__).resolve().parent.parent
    block = "; ".join(f"sys.modules[{m!r}] = None" for m in ("playwright", "pytest", "hypothesis"))
    code = f"import runpy, sys; {block}; sys.argv = [{script!r}, '--help']; runpy.run_path('scripts/{script}', run_name='__main__')"
    r = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "usage:" in r.stdout
