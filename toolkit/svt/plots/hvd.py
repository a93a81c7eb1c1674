"""Hybrid Verified Decoding figures: speed-up against τ per workload, and the precision-recall
curve of high-yield drafts per yield predictor (read from report.json; nothing recomputed)."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from svt.errors import DataError
from svt.plots.style import add_caption, figure_axes, palette


def hvd(report: dict, ax=None):
    """Speed-up against greedy decoding as τ varies, one panel per group (all, each workload): one
    line per yield predictor; model-only (τ = +inf), cache-only (τ = -inf) and the oracle switch as
    horizontal lines."""
    sim = report.get("hvd")
    if not sim:
        raise DataError("The report has no HVD replay: run `svt evaluate` on a run with cache drafts, "
                        "with --costs COSTS.")
    groups = list(dict.fromkeys(r["group"] for r in sim["rows"]))
    if ax is None:
        ncols = min(3, len(groups))
        nrows = -(-len(groups) // ncols)
        fig, grid = plt.subplots(nrows, ncols, figsize=(4.3 * ncols, 3.6 * nrows), constrained_layout=True,
                                 squeeze=False, sharey=True)
        axes = list(grid.ravel())
        for extra in axes[len(groups):]:
            extra.set_visible(False)
        axes = axes[: len(groups)]
    else:
        fig, axes = ax.figure, [ax] * len(groups)
    preds = list(dict.fromkeys(r["predictor"] for r in sim["rows"] if "predictor" in r))
    # bands: the cost model's 95 % range where the table keeps refits, else the requests' (any cost file)
    key = "cost_ci95" if sim.get("cost_refits") else "request_ci95"
    for a, g in zip(axes, groups, strict=True):
        rows = [r for r in sim["rows"] if r["group"] == g]
        for i, p in enumerate(preds):
            pts = sorted((r["tau"], r["speedup_vs_greedy"]) for r in rows
                          if r.get("predictor") == p and r["tau"] is not None and math.isfinite(r["tau"]))
            a.plot(*zip(*pts, strict=True), "-o", ms=3, lw=1.2, color=palette(len(preds))[i], label=f"HVD {p}")
            band = sorted((r["tau"], *r[key]["speedup_vs_greedy"]) for r in rows
                          if r.get("predictor") == p and r["tau"] is not None and math.isfinite(r["tau"])
                          and (r.get(key) or {}).get("speedup_vs_greedy"))
            if band:
                a.fill_between(*zip(*band, strict=True), color=palette(len(preds))[i], alpha=0.18, lw=0)
        for pol, style in (("model-only", ("k", "--")), ("cache-only", ("0.45", ":")), ("oracle-switch", ("C3", "-."))):
            row = next(r for r in rows if r["policy"] == pol)
            a.axhline(row["speedup_vs_greedy"], color=style[0], ls=style[1], lw=1,
                      label=pol + (" (bound)" if pol == "oracle-switch" else ""))
            ci = (row.get(key) or {}).get("speedup_vs_greedy")
            if ci:
                a.axhspan(*ci, color=style[0], alpha=0.08, lw=0)
        a.axhline(1.0, color="0.8", lw=0.8)
        a.set(title=f"{g}", xlabel="τ (cache draft verified when predicted yield > τ)")
        a.grid(alpha=0.3)
    for a in axes[:: min(3, len(axes))]:
        a.set_ylabel("speed-up vs greedy (simulated, B = 1)")
    axes[-1].legend(fontsize=6, loc="best")
    fig.suptitle(f"Hybrid Verified Decoding replay, K = {sim['k']} ({sim['costs']['kind']} costs: "
                 f"{Path(sim['costs']['path']).name}"
                 f"{'; UNRELIABLE: measured on a busy or noisy machine' if sim['costs'].get('warnings') else ''})",
                 fontsize=9)
    add_caption(fig, report, f"   bands: 95 % over {sim['cost_refits']} refits of the cost model"
                if sim.get("cost_refits") else f"   bands: 95 % over {sim['request_bootstrap']} resamples of the "
                "requests" if sim.get("request_bootstrap") else "")
    return fig


def yield_pr(report: dict, ax=None):
    """Precision against recall of high-yield drafts (oracle yield >= the report's threshold) when
    ranked by each yield predictor; the marker is each predictor's point at its own threshold."""
    yl = report.get("yield")
    if not yl or not yl.get("predictors"):
        raise DataError("The report has no yield predictors: run `svt evaluate` on a run with cache drafts.")
    fig, ax = figure_axes(ax, (6.0, 4.8))
    for i, (name, b) in enumerate(yl["predictors"].items()):
        c = b.get("pr_curve") or {}
        if not c:
            continue
        color = palette(len(yl["predictors"]))[i]
        ls = ":" if b.get("kind") == "rule" else "-"
        ap = b.get("average_precision")
        ax.plot(c["recall"], c["precision"], ls, color=color, lw=1.3,
                label=f"{name}{' (rule)' if b.get('kind') == 'rule' else ''}, AP {ap:.3f}" if ap is not None else name)
        if b.get("precision") is not None and b.get("recall") is not None and np.isfinite(b["precision"]):
            ax.plot([b["recall"]], [b["precision"]], "o", color=color, ms=6)
    ax.set(xlim=(0, 1.02), ylim=(0, 1.02), xlabel="recall", ylabel="precision",
           title=f"High-yield cache drafts (accepted length >= {yl['high_yield']})\n"
                 f"{yl['requests']} scored requests")
    ax.legend(fontsize=7)
    add_caption(fig, report, "   dot: prediction >= threshold")
    return fig


def hvd_map(report: dict, ax=None, vmax: float | None = None):
    """Where HVD pays off: drafter strength (tokens per cycle of a stand-in model drafter) against
    workload, coloured by HVD's gain over the better single source (model-only or cache-only), with
    τ chosen on other requests than those scored. Each cell shows the gain in % and its 95 %
    request-level bootstrap interval; a gain whose interval spans 0 is in parentheses, a cell scored
    on fewer than 10 requests is hatched. ``vmax`` (in %) fixes the symmetric colour scale, so maps
    of several reports share one."""
    from matplotlib.patches import Rectangle

    hmap = report.get("hvd_map") or {}
    rows = hmap.get("rows")
    if not rows:
        raise DataError("The report has no HVD map: run `svt evaluate` on a run with cache drafts, with --costs COSTS.")
    if vmax is not None and not (math.isfinite(vmax) and vmax > 0):
        raise DataError(f"--vmax must be a positive number of percent, but got {vmax!r}.")
    strengths = sorted({r["strength"] for r in rows})
    groups = [g for g in dict.fromkeys(r["group"] for r in rows) if g != "all"] + ["all"]
    # workload rows scored on too few requests in every cell say nothing a reader can use: the `all`
    # row alone is drawn then, and the caption says why
    thin = [g for g in groups[:-1] if all(r.get("requests", FEW) < FEW for r in rows if r["group"] == g)]
    dropped = len(thin) == len(groups) - 1 and len(groups) > 1 and any(r["group"] == "all" for r in rows)
    if dropped:
        groups, rows = ["all"], [r for r in rows if r["group"] == "all"]
    grid = np.full((len(groups), len(strengths)), np.nan)
    cells = {}
    for r in rows:
        i, j = groups.index(r["group"]), strengths.index(r["strength"])
        grid[i, j] = 100.0 * r["hvd_gain_over_best_single"]
        cells[i, j] = r
    fig, ax = figure_axes(ax, (1.45 * len(strengths) + 3.2, 0.62 * len(groups) + 2.2))
    lim = float(vmax) if vmax is not None else max(5.0, float(np.nanmax(np.abs(grid))))
    im = ax.imshow(grid, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto")
    spans = few = 0
    for (i, j), v in np.ndenumerate(grid):
        if not np.isfinite(v):
            continue
        r = cells[i, j]
        ci = r.get("gain_interval")
        zero = bool(r.get("gain_interval_spans_zero"))
        spans += zero
        text = f"({_pct(v)}%)" if zero else f"{_pct(v)}%"
        if ci is not None:
            text += f"\n[{_pct(100 * ci[0])}, {_pct(100 * ci[1])}]"
        ax.text(j, i, text, ha="center", va="center", fontsize=7, linespacing=1.1,
                color="white" if abs(v) > 0.6 * lim else "black")
        if r.get("requests", FEW) < FEW:
            few += 1
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor=(0, 0, 0, 0.22),
                                   lw=0))
    ax.set_xticks(range(len(strengths)), [f"{s:g}" for s in strengths])
    ax.set_yticks(range(len(groups)), groups)
    ax.set(xlabel="model drafter strength (tokens per cycle, stand-in)", ylabel="workload",
           title=f"HVD's gain over the better single source (predictor {hmap['predictor']})")
    bar = fig.colorbar(im, ax=ax, fraction=0.05, pad=0.02)
    bar.set_label("gain over the better single source (%)\n= its time / HVD's time − 1", fontsize=8)
    costs = (report.get("hvd") or {}).get("costs") or {}
    notes = ["[95 % request-level bootstrap interval]"]
    if spans:
        notes.append("(gain): interval spans 0")
    if few:
        notes.append(f"hatched: < {FEW} scored requests")
    if dropped:
        notes.append(f"per-workload rows left out: each cell < {FEW} scored requests")
    add_caption(fig, report, f"   {Path(costs.get('path', '')).name} costs; τ chosen on other requests; "
                             + "; ".join(notes))
    return fig


FEW = 10  # svt.simulate.hvd_sweep.FEW_REQUESTS (plots import nothing from simulate)


def _pct(v: float) -> str:
    """A signed whole percentage; a value that rounds to 0 is +0, never -0."""
    return f"{round(v) + 0:+d}"
