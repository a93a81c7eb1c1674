"""Every `from svt... import name` in the benchmarks, scripts and notebooks names something that
exists: a refactor that moves a function must move its users too (they are not run by the suite)."""

import ast
import importlib
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _sources():
    for p in sorted([*REPO.glob("benchmarks/*.py"), *REPO.glob("scripts/*.py"), *REPO.glob("examples/**/*.py")]):
        yield p, p.read_text()
    for p in sorted(REPO.glob("notebooks/*.ipynb")):
        cells = json.loads(p.read_text())["cells"]
        yield p, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def _svt_imports():
    for path, text in _sources():
        try:
            tree = ast.parse(text)
        except SyntaxError:  # notebook magics: read line by line
            tree = ast.parse("\n".join(line for line in text.splitlines() if not line.lstrip().startswith(("%", "!"))))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("svt"):
                for alias in node.names:
                    yield path.relative_to(REPO), node.module, alias.name


@pytest.mark.parametrize("where, module, name", sorted(set(_svt_imports())), ids=lambda x: str(x))
def test_imported_name_exists(where, module, name):
    mod = importlib.import_module(module)
    assert hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}") is not None, (where, module, name)
