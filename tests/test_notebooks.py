"""Notebooks run top to bottom against the public API (nbclient), show their results inline, and are
stored with their outputs stripped."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
# what each notebook must show (in its text outputs) and how many figures at least
SHOWS = {"01_collect.ipynb": ("acceptance", 0), "02_features_and_metrics.ipynb": ("−entropy", 3),
         "03_online_estimator.ipynb": ("per-position slope", 4), "04_end_to_end.ipynb": ("replayed_tokens_per_step", 1),
         "05_hvd.ipynb": ("oracle-switch", 2), "06_interop.ipynb": ("not computed", 0),
         "07_trees.ipynb": ("predictor (cross-fitted)", 2)}


def test_every_notebook_is_known():
    assert set(NOTEBOOKS) == set(SHOWS)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_is_stored_stripped(name):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, \
                f"{name}: clear the outputs before committing (Jupyter: Edit > Clear All Outputs)"


# the notebooks that collect tens of requests (15-30 s each) are end-to-end: `make test-slow`
SLOW = {"02_features_and_metrics.ipynb", "03_online_estimator.ipynb", "04_end_to_end.ipynb", "05_hvd.ipynb"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in NOTEBOOKS])
def test_notebook_executes(name, models_dir, monkeypatch):
    monkeypatch.setenv("SVT_ROOT", str(ROOT))
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    # execute() raises on the first cell that fails; what is checked here is what the notebook shows
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "every code cell ran"
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    shown = [o for o in outputs if o.get("output_type") in ("execute_result", "display_data")]
    assert len(shown) >= len(code) // 2, "the notebook shows its results inline"
    text = " ".join(str(o.get("data", {}).get("text/plain", "")) for o in shown)
    word, figures = SHOWS[name]
    assert word in text
    assert sum("image/png" in o.get("data", {}) for o in shown) >= figures, "figures are drawn inline"
    assert not [o for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr"
                and "Traceback" in o.get("text", "")]
