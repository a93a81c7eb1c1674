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


def test_fitting_evaluating_and_plotting_do_not_import_torch():
    """torch takes ~2 s to import on 2 cores: `svt fit/evaluate/plot` reach it only for a head or
    a yield MLP (the fitter registry imports every fitter; their torch sides are read on first use)."""
    import subprocess
    import sys

    code = ("import sys, svt.cli, svt.fit, svt.report.evaluate, svt.plots, svt.simulate; "
            "from svt.fit.head import HeadFitter; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_the_head_names_still_import_from_their_old_module():
    from svt.fit.head import ConfidenceHead, HeadConfig, predict_head, train_head  # noqa: F401

    with pytest.raises(ImportError):
        from svt.fit.head import no_such_name  # noqa: F401
