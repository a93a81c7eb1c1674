"""What every figure shares: the file backend, the colour cycle, a figure's axes and its caption."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import matplotlib
import numpy as np

# files, not windows: Agg, unless a backend was chosen (a Jupyter kernel's inline backend draws
# the returned figures in the notebook)
if not os.environ.get("MPLBACKEND") and "ipykernel" not in sys.modules:
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def palette(n: int) -> list:
    """``n`` colours no two of which are alike, for the ``n`` series of one axes: matplotlib's
    cycle up to 10, tab20 up to 20, then evenly spaced samples of a perceptual map (a figure of
    12 predictors drew two pairs of them in one colour with the 10-colour cycle)."""
    if n <= len(COLORS):
        return list(COLORS)
    if n <= 20:
        return list(plt.get_cmap("tab20").colors)
    cmap = plt.get_cmap("turbo")
    return [cmap(x) for x in np.linspace(0.05, 0.95, n)]


def add_caption(fig, report: dict, extra: str = "") -> None:
    """One caption line under the axes (constrained layout keeps room for it)."""
    runs = ", ".join(r["run"] for r in report.get("runs", []))
    models = report.get("runs", [{}])[0].get("models", {})
    pair = " + ".join(Path(str(models[k])).name for k in ("target", "draft") if models.get(k))
    s = report.get("runs", [{}])[0].get("sampling") or {}
    text = (f"run: {runs}   pair: {pair}   T={s.get('temperature')}, top-p={s.get('top_p')}   "
            f"svt {report.get('svt_version')}{extra}")
    # wrapped to the figure's width (about 17 characters an inch at 7 points): never cut off
    fig.supxlabel(textwrap.fill(text, max(40, int(fig.get_figwidth() * 17))), fontsize=7, color="0.35")


def figure_axes(ax, figsize=(6.4, 4.8)):
    """The figure and axes to draw on: ``ax`` and its figure, or a new figure of ``figsize``."""
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize, constrained_layout=True)
    return ax.figure, ax
