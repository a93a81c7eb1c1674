"""The package's shape: layers import only downwards, no import circles, no private names borrowed
across modules, and short functions. Each test reads the source with ``ast`` (nothing is imported),
so a new upward import fails here with the edge that broke the rule."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "toolkit"

# A package may import its own layer or a lower one. The order the issue tracker and the docs give:
# cli/pair -> report/plots -> vllm_plugin -> simulate/fit/collect -> features/metrics/models/trees -> traces/config
# -> the base (errors, fileio, signals, the version).
LAYERS = {
    "svt": 0, "errors": 0, "fileio": 0, "signals": 0, "devices": 0, "cores": 0,
    "traces": 1, "config": 1,
    "features": 2, "metrics": 2, "models": 2, "trees": 2,
    "simulate": 3, "fit": 3, "collect": 3,
    "vllm_plugin": 4,
    "report": 5, "plots": 5, "interop": 5, "distributed": 5,
    "cli": 6, "warmup": 6, "pair": 6,
}
MAX_LINES = 80
LONG_MARK = "Long because"  # a longer function's docstring says why, after these words


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for p in sorted((root / "svt").rglob("*.py")):
        parts = list(p.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """Module -> the svt modules it imports (at any depth of the file, lazy imports included), and
    every (importer, module, name) where a private name is imported from another module."""
    edges: dict[str, set[str]] = collections.defaultdict(set)
    private = []
    for mod, path in mods.items():
        pkg = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1] if node.level else []
                target = ".".join([*base, node.module] if node.module else base) if node.level else node.module
                if not target or not target.startswith("svt"):
                    continue
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    if full in mods:  # `from svt.pkg import submodule`
                        edges[mod].add(full)
                        continue
                    edges[mod].add(target)
                    name = alias.name
                    if name.startswith("_") and not name.startswith("__") and target != mod:
                        private.append((mod, target, name))
            elif isinstance(node, ast.Import):
                edges[mod].update(a.name for a in node.names if a.name.startswith("svt"))
    return {m: {t for t in ts if t != m} for m, ts in edges.items()}, private


def package(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "svt"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def visit(v: str) -> None:
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
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


MODS = modules()
EDGES, PRIVATE = imports(MODS)


def test_every_package_has_a_layer():
    assert {package(m) for m in MODS} == set(LAYERS)


def test_no_layer_imports_upwards():
    upward = sorted(f"{m} -> {t}" for m, ts in EDGES.items() for t in ts
                    if LAYERS[package(t)] > LAYERS[package(m)])
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_fitting_never_loads_the_model_package():
    """A fit (even of a head on a GPU) needs a device, not the collectors' model loading."""
    into_models = sorted(f"{m} -> {t}" for m, ts in EDGES.items() for t in ts
                         if package(m) == "fit" and package(t) == "models")
    assert not into_models, "\n".join(into_models)


def test_no_import_circles_between_modules_or_packages():
    assert not cycles(EDGES)
    packages: dict[str, set[str]] = collections.defaultdict(set)
    for m, ts in EDGES.items():
        packages[package(m)].update(package(t) for t in ts if package(t) != package(m))
    assert not cycles(packages)


def test_no_private_name_is_imported_from_another_module():
    assert not PRIVATE, "\n".join(f"{m} imports {n} from {t}" for m, t, n in PRIVATE)


def long_functions(mods: dict[str, Path] = MODS) -> list[str]:
    out = []
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_LINES and LONG_MARK not in (ast.get_docstring(node) or ""):
                    out.append(f"{mod}.{node.name}: {n} lines")
    return out


def test_functions_are_short_or_say_why():
    assert not long_functions(), "\n".join(long_functions())


# the checks above catch what they are for (each planted in a copy of a small package)

def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        p = tmp_path / "svt" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return modules(tmp_path)


@pytest.mark.parametrize("text, bad", [
    ("from svt.report.render import shown\n", "upward"),
    ("def f():\n    from svt.cli import app\n", "upward"),  # a lazy import counts too
    ("from svt.traces.io import _private\n", "private"),
    ("from ..traces.io import _private\n", "private"),
])
def test_the_checks_catch_a_planted_import(tmp_path, text, bad):
    mods = _package(tmp_path, {"__init__.py": "", "traces/__init__.py": "", "traces/io.py": "_private = 1\n",
                               "report/__init__.py": "", "report/render.py": "shown = 1\n",
                               "cli.py": "app = 1\n", "metrics/__init__.py": "", "metrics/bad.py": text})
    edges, private = imports(mods)
    up = [t for t in edges.get("svt.metrics.bad", ()) if LAYERS[package(t)] > LAYERS["metrics"]]
    assert (up if bad == "upward" else private)


def test_a_planted_circle_and_a_long_function_are_found(tmp_path):
    mods = _package(tmp_path, {"__init__.py": "", "fit/__init__.py": "", "fit/a.py": "from svt.fit.b import x\n",
                               "fit/b.py": "def x():\n    from svt.fit.a import y\n" + "    y()\n" * 90})
    edges, _ = imports(mods)
    assert cycles(edges) == [["svt.fit.a", "svt.fit.b"]]
    assert long_functions(mods) == ["svt.fit.b.x: 92 lines"]
