"""Notebooks run top to bottom against the public API (nbclient)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb")))
def test_notebook_executes(name, models_dir, monkeypatch):
    monkeypatch.setenv("SVT_ROOT", str(ROOT))
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    # execute() raises on the first cell that fails; what is checked here is what the notebook shows
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), "every code cell ran"
    shown = [o for c in code for o in c.get("outputs", []) if o.get("output_type") in ("execute_result", "display_data")]
    assert len(shown) >= len(code) // 2, "the notebook shows its results inline"
    text = " ".join(str(o.get("data", {}).get("text/plain", "")) for o in shown)
    assert "acceptance" in text or "labelled" in text
