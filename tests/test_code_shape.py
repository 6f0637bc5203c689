"""The house rules the refactor issue set, kept true: no source file in respec/ or app/ over 500
lines, no function over 80 lines, and no drafter reading another drafter's state."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*ROOT.glob("respec/**/*.py"), *ROOT.glob("app/**/*.py"), ROOT / "app.py"])


def test_no_source_file_over_500_lines_and_no_function_over_80():
    too_long = []
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(ROOT)
        if len(text.splitlines()) > 500:
            too_long.append(f"{rel}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 80:
                    too_long.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    assert SOURCES and not too_long, "\n".join(too_long)


def test_retrieval_drafters_use_the_inner_eagle_drafter_through_methods_only():
    """sam.py and respec.py hold an Eagle2Drafter; they may call it, not read its fields."""
    for name in ("sam.py", "respec.py"):
        tree = ast.parse((ROOT / "respec" / "drafters" / name).read_text(encoding="utf-8"))
        calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        reads = [f"{name}:{n.lineno} .eagle.{n.attr}" for n in ast.walk(tree)
                 if isinstance(n, ast.Attribute) and id(n) not in calls
                 and isinstance(n.value, ast.Attribute) and n.value.attr == "eagle"]
        assert not reads, reads


def test_app_never_calls_into_the_engine():
    """app/ runs a method through `Runner.stream` (a RunStream: steps, partial(), result), never the
    Engine: no import of respec.engine, no runner.engine(), no engine.prefill / engine.assemble."""
    found = []
    for path in [p for p in SOURCES if p.is_relative_to(ROOT / "app")]:
        rel = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("respec.engine"):
                found.append(f"{rel}:{node.lineno} from {node.module} import ...")
            elif isinstance(node, ast.Import) and any(a.name.startswith("respec.engine") for a in node.names):
                found.append(f"{rel}:{node.lineno} import respec.engine")
            elif isinstance(node, ast.Attribute) and node.attr in ("engine", "prefill", "assemble"):
                found.append(f"{rel}:{node.lineno} .{node.attr}")
    assert not found, found
