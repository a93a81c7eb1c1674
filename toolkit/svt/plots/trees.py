"""Draft-tree figures (read from a tree report's report.json; nothing recomputed): accepted tokens
against the nodes a policy verifies, and the calibration of path probabilities by depth."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from svt.errors import DataError
from svt.plots.style import COLORS, add_caption, figure_axes, palette

POLICY_STYLE = {"chain": ("o", "-"), "static": ("s", ":"), "path-prob": ("^", "-"), "predictor": ("v", "--"),
                "oracle": ("*", ":")}


def _trees(report: dict) -> dict:
    if report.get("kind") != "trees":
        raise DataError("Tree figures draw a tree run's report (`svt evaluate` on a run collected with `tree:`).")
    return report["trees"]


def tree_budget(report: dict, ax=None):
    """Accepted tokens per step against nodes verified per step, one line per policy (greedy runs)."""
    t = _trees(report)
    if not t.get("replay"):
        raise DataError("The tree report has no policy replay (a sampling run): collect with temperature 0.")
    fig, ax = figure_axes(ax)
    policies = list(dict.fromkeys(r["policy"] for r in t["replay"]))
    for i, policy in enumerate(policies):
        rows = sorted((r for r in t["replay"] if r["policy"] == policy), key=lambda r: r["nodes_per_step"])
        marker, line = POLICY_STYLE.get(policy, ("o", "-"))
        ax.plot([r["nodes_per_step"] for r in rows], [r["accepted_per_step"] for r in rows], marker=marker,
                linestyle=line, color=palette(len(policies))[i], label=policy)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("nodes verified per step (tree size)")
    ax.set_ylabel("accepted tokens per step")
    ax.set_title("tree policies replayed on the logged trees (greedy)")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    add_caption(fig, report)
    return fig


def tree_calibration(report: dict, ax=None):
    """Reliability of path probabilities (against being on the accepted path), one panel per depth."""
    t = _trees(report)
    row = next((c for c in t["calibration"] if c["predictor"] == "path_prob"), None)
    if row is None or not row["by_depth"]:
        raise DataError("The tree report has no path-probability calibration.")
    depths = [d["depth"] for d in row["by_depth"]]
    if ax is None:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), constrained_layout=True)
    else:
        fig, axes = ax.figure, [ax, ax]
    b = row["bins"]
    w = np.array(b["weight"], dtype=float)
    pred = np.array([np.nan if v is None else v for v in b["mean_pred"]])
    rate = np.array([np.nan if v is None else v for v in b["rate"]])
    keep = w > 0
    axes[0].plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1)
    axes[0].scatter(pred[keep], rate[keep], s=20 + 200 * w[keep] / w.sum(), color=COLORS[0], zorder=3)
    axes[0].plot(pred[keep], rate[keep], color=COLORS[0])
    axes[0].set_xlabel("path probability (bin mean)")
    axes[0].set_ylabel("share on the accepted path")
    axes[0].set_title(f"all depths: ECE {row['ece']:.3f}, AUC {row['auc']:.3f}")
    axes[0].grid(alpha=0.3)
    x = np.arange(len(depths))
    mean_pred = [d["mean_pred"] for d in row["by_depth"]]
    rates = [d["rate"] for d in row["by_depth"]]
    axes[1].bar(x - 0.2, mean_pred, width=0.4, color=COLORS[0], label="mean path probability")
    axes[1].bar(x + 0.2, rates, width=0.4, color=COLORS[1], label="share on the accepted path")
    for xi, d in zip(x, row["by_depth"], strict=True):
        if d["ece"] is not None:
            axes[1].annotate(f"ECE {d['ece']:.3f}", (xi, max(d["mean_pred"], d["rate"])), ha="center",
                             va="bottom", fontsize=7)
    axes[1].set_xticks(x, [str(d) for d in depths])
    axes[1].set_xlabel("depth (0 = the root's children)")
    axes[1].set_title("predicted against realised, by depth")
    axes[1].legend(frameon=False)
    axes[1].grid(alpha=0.3, axis="y")
    add_caption(fig, report)
    return fig
