"""What every figure shares: the file backend, the colour cycle, a figure's axes and its caption."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import matplotlib

# files, not windows: Agg, unless a backend was chosen (a Jupyter kernel's inline backend draws
# the returned figures in the notebook)
if not os.environ.get("MPLBACKEND") and "ipykernel" not in sys.modules:
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def add_caption(fig, report: dict, extra: str = "") -> None:
    """One caption line under the axes (constrained layout keeps room for it)."""
    runs = ", ".join(r["run"] for r in report.get("runs", []))
    models = report.get("runs", [{}])[0].get("models", {})
    pair = " + ".join(Path(str(models[k])).name for k in ("target", "draft") if models.get(k))
    s = report.get("runs", [{}])[0].get("sampling") or {}
    fig.supxlabel(f"run: {runs}   pair: {pair}   T={s.get('temperature')}, top-p={s.get('top_p')}   "
                  f"svt {report.get('svt_version')}{extra}", fontsize=7, color="0.35")


def figure_axes(ax, figsize=(6.4, 4.8)):
    """The figure and axes to draw on: ``ax`` and its figure, or a new figure of ``figsize``."""
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize, constrained_layout=True)
    return ax.figure, ax
