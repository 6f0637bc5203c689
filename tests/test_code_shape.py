"""The house rules, kept true: no source file in respec/ or app/ over 500 lines, no function over 80
lines, no drafter reading another drafter's state, and the architecture read from the import graph
(every import statement, top-level or not): no cycle, the algorithm never reaching respec.accel,
app/ using respec's public API only, few function-level imports and each with its reason, rooms
that keep the top levels small, no probe of a forward's speed attributes outside respec/accel/."""
from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

import respec

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


# ---------------------------------------------------------------------------- the import graph
# Every import statement counts: top-level, inside functions, under TYPE_CHECKING.
PACKAGES = ("respec", "app")
ALGORITHM = ("respec.engine", "respec.tree", "respec.verify", "respec.cost", "respec.sampling", "respec.tokens",
             "respec.drafters", "respec.retrieval")
SPEED_ATTRS = {"compiled", "linear_layouts", "buckets", "eager_from", "fast", "route", "eager_plan", "_compiled",
               "_buckets", "_eager_from"}
LAZY_REASONS = ("# lazy:", "# optional:")
MAX_FUNCTION_IMPORTS = 20


def _modules(root: Path) -> dict[str, Path]:
    mods = {}
    for path in sorted(p for pkg in PACKAGES for p in root.glob(f"{pkg}/**/*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


def _imports(root: Path):
    """(module, line, imported module, inside a function) for every import of a project module."""
    mods = _modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    found = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                names = subs or [base]
            else:
                continue
            for name in names:
                target = resolve(name) if name.split(".")[0] in PACKAGES else None
                if target and target != mod:
                    found.append((mod, node.lineno, target, id(node) in inner))
    return found


def _cycles(edges) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def _reach(edges, start: str) -> set[str]:
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    seen, todo = set(), [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def _in(mod: str, prefixes) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def violations(root: Path) -> list[str]:
    """Every architecture rule the import graph of `root` breaks (empty: none)."""
    imports = _imports(root)
    edges = {(a, b) for a, _, b, _ in imports}
    bad = [f"import cycle: {' -> '.join(c)}" for c in _cycles(edges)]
    for mod in _modules(root):
        if _in(mod, ALGORITHM):
            bad += [f"{mod} reaches {m} (the algorithm never imports respec.accel)"
                    for m in sorted(_reach(edges, mod)) if _in(m, ("respec.accel",))]
    public = set(respec.PUBLIC_MODULES)
    bad += [f"{a}:{line} imports {b}, not respec's public API" for a, line, b, _ in imports
            if _in(a, ("app",)) and b.startswith("respec") and b not in public]
    return bad


def test_the_import_graph_keeps_the_rules():
    """No cycle; the algorithm (engine, tree, verify, cost, sampling, tokens, drafters, retrieval)
    never reaches respec.accel, even through another module; app/ imports only what respec's
    package docstring lists as public (respec.PUBLIC_MODULES)."""
    assert violations(ROOT) == []


@pytest.mark.parametrize("extra, rule", [
    ({"respec/tree.py": "def f():\n    from respec.engine import Engine\n"}, "import cycle"),
    ({"respec/verify.py": "import respec.accel.compiled\n"}, "never imports respec.accel"),
    ({"respec/retrieval/extra.py": "from respec.models.hf import HFTarget\n"}, "never imports respec.accel"),
    ({"app/views/extra.py": "from respec.engine import Engine\n"}, "not respec's public API"),
])
def test_the_rules_fail_on_a_cycle_or_a_forbidden_edge(tmp_path, extra, rule):
    """A copy of the tree with one bad import added breaks the rule it should."""
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__", "static"))
    assert violations(tmp_path) == []
    for rel, code in extra.items():
        path = tmp_path / rel
        path.write_text(path.read_text(encoding="utf-8") + "\n" + code if path.exists() else code, encoding="utf-8")
    assert any(rule in v for v in violations(tmp_path)), violations(tmp_path)


def test_function_level_imports_are_few_and_say_why():
    """Project imports inside functions only where they keep start-up light or guard an optional
    package, each saying so on its line; at most MAX_FUNCTION_IMPORTS."""
    inner = {(a, line) for a, line, _, is_inner in _imports(ROOT) if is_inner}
    mods = _modules(ROOT)
    unexplained = [f"{a}:{line}" for a, line in sorted(inner)
                   if not any(r in mods[a].read_text(encoding="utf-8").splitlines()[line - 1] for r in LAZY_REASONS)]
    assert len(inner) <= MAX_FUNCTION_IMPORTS and not unexplained, (len(inner), unexplained)


def test_rooms_keep_the_top_levels_small():
    """respec/'s top level holds the algorithm and its composition (at most 18 modules besides
    __init__ and __main__); app/ has no flat module besides its package entry."""
    top = [p.name for p in (ROOT / "respec").glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    flat = [p.name for p in (ROOT / "app").glob("*.py") if p.name != "__init__.py"]
    assert len(top) <= 18 and flat == [], (sorted(top), flat)


def test_no_probe_of_speed_attributes_outside_accel():
    """What the cost model, bench and trace need of a forward comes through typed methods
    (TargetModel.describe_forward, prepare_head), not getattr/hasattr probes of speed attributes."""
    probes = []
    for path in SOURCES:
        if "accel" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in SPEED_ATTRS):
                probes.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.func.id}(..., {node.args[1].value!r})")
    assert probes == [], probes


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
