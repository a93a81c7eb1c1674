"""Figures from stored results: every function reads a report (report.json) or a fit file and draws;
nothing is recomputed here. Each takes ``ax=None`` and returns the figure.

Kinds (``PLOTS``): ``reliability``, ``roc``, ``per-position``, ``pareto``, ``coefficients`` (an
online fit's path), ``features`` (the feature table as a dot plot), ``hvd`` (speed-up against τ per
workload) and ``yield-pr`` (precision-recall of high-yield cache drafts).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from svt.errors import ConfigError, DataError
from svt.fileio import read_json
from svt.plots.hvd import hvd, hvd_map, yield_pr
from svt.plots.style import add_caption, figure_axes, palette
from svt.plots.trees import tree_budget, tree_calibration
from svt.report.text import shown


def _prob_features(report: dict) -> dict:
    return {n: f for n, f in report["features"].items() if f.get("probability") and f.get("curves", {}).get("reliability")}


def reliability(report: dict, ax=None):
    """Predicted probability against observed acceptance, one curve per probability score; marker
    area ~ drafts in the bin."""
    feats = _prob_features(report)
    if not feats:
        raise DataError("The report has no probability score to draw a reliability diagram for.")
    fig, ax = figure_axes(ax)
    ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--", label="perfect calibration")
    colors = palette(len(feats))
    for i, (name, f) in enumerate(feats.items()):
        r = f["curves"]["reliability"]
        c = np.asarray(r["count"], dtype=float)
        ax.plot(r["mean_pred"], r["rate"], "-", color=colors[i], lw=1.2,
                label=f"{name} (ECE {f['ece']:.3f})")
        ax.scatter(r["mean_pred"], r["rate"], s=20 + 200 * c / c.max(), color=colors[i], alpha=0.7)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="predicted acceptance probability (bin mean)",
           ylabel="observed acceptance rate", title="Reliability (hard labels; marker area ~ drafts per bin)")
    ax.legend(fontsize=7, loc="upper left")
    add_caption(fig, report)
    return fig


def roc(report: dict, ax=None):
    """ROC curves of every scored feature and predictor (dotted: lossy)."""
    if not any(f.get("curves", {}).get("roc") and f.get("auc") is not None for f in report["features"].values()):
        raise DataError("The report has no feature with a ROC curve to draw.")
    fig, ax = figure_axes(ax)
    ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--", label="chance")
    drawn = [(n, f) for n, f in report["features"].items() if f.get("curves", {}).get("roc") and f.get("auc") is not None]
    colors = palette(len(drawn))
    for i, (name, f) in enumerate(drawn):
        r = f["curves"]["roc"]
        ls = "-" if f["lossless"] else ":"
        ax.plot(r["fpr"], r["tpr"], ls, color=colors[i], lw=1.3,
                label=f"{shown(name, f)} (AUC {f['auc']:.3f}{'' if f['lossless'] else ', lossy'})")
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="false positive rate (rejected drafts ranked above the cut)",
           ylabel="true positive rate (accepted drafts)", title="ROC of acceptance scores (dotted: lossy features)")
    ax.legend(fontsize=7, loc="lower right")
    add_caption(fig, report)
    return fig


def per_position(report: dict, ax=None):
    """AUC by draft position per predictor, and acceptance by position in both conventions."""
    if ax is None:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.6), constrained_layout=True)
    else:
        fig, a1, a2 = ax.figure, ax, ax.twinx()
    feats = report["features"]
    if not feats:
        raise DataError("The report has no acceptance feature to draw by position (a run without model drafts).")
    positions = sorted({int(p) for f in feats.values() for p in f["per_position"]})
    n = max(1, len(feats))
    colors = palette(n)
    width = 0.8 / n
    lowest = 0.4
    for i, (name, f) in enumerate(feats.items()):
        vals = [f["per_position"].get(str(p), f["per_position"].get(p, {})).get("auc") for p in positions]
        vals = [np.nan if v is None else v for v in vals]
        lowest = min([lowest, *(v - 0.05 for v in vals if not np.isnan(v))])
        a1.bar(np.arange(len(positions)) + (i - (n - 1) / 2) * width, vals, width, color=colors[i],
               label=shown(name, f), hatch="" if f["lossless"] else "//")
    a1.axhline(0.5, color="0.5", lw=0.8, ls="--")
    a1.set(xticks=range(len(positions)), xticklabels=positions, xlabel="draft position (0-based)",
           ylabel="AUC", ylim=(max(0.0, lowest), 1.0), title="AUC by draft position (hatched: lossy)")
    # below the bars, not over them: a dozen predictors' entries would cover the first positions
    a1.legend(fontsize=6, ncol=min(4, n), loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)
    acc = report["acceptance"]["by_position"]
    x = [r["position"] for r in acc]
    a2.plot(x, [r["conditional"] for r in acc], "o-", label="conditional (accepted / verified)")
    a2.plot(x, [r["marginal"] for r in acc], "s-", label="marginal (accepted / proposed)")
    a2.set(xlabel="draft position (0-based)", ylabel="acceptance rate", ylim=(0, 1),
           title="Acceptance by draft position", xticks=x)
    a2.legend(fontsize=8)
    add_caption(fig, report)
    return fig


def pareto(report: dict, ax=None):
    """Throughput against interactivity per policy across concurrency; the frontier highlighted."""
    sim = report.get("simulation")
    if not sim:
        raise DataError("The report has no simulation: run `svt evaluate ... --costs COSTS`.")
    fig, ax = figure_axes(ax, (7.2, 5.2))
    # the document's (engine) budget rule is compared in report.md's rule audit; drawn here it
    # would only double every AV curve
    pts = [p for p in sim["points"] if "[engine rule]" not in p["policy"]]
    policies = list(dict.fromkeys(p["policy"] for p in pts))
    colors = palette(len(policies))
    for i, pol in enumerate(policies):
        mine = [p for p in pts if p["policy"] == pol]
        style = {"marker": "*", "ms": 9} if pol == "oracle" else ({"marker": "D", "ms": 5} if pol.startswith("AV")
                                                                 else {"marker": "o", "ms": 4})
        ax.plot([p["interactivity"] for p in mine], [p["throughput"] for p in mine], "-" if pol != "oracle" else ":",
                color=colors[i % len(colors)], lw=1, label=pol + (" (per-step bound)" if pol == "oracle" else ""),
                **style)
        _whiskers(ax, mine, colors[i % len(colors)])
    front = sorted((p for p in pts if p["pareto"]), key=lambda p: p["interactivity"])
    ax.plot([p["interactivity"] for p in front], [p["throughput"] for p in front], color="k", lw=5,
            alpha=0.2, label="Pareto frontier (deployable policies)", zorder=0)
    for p in pts:
        if p["policy"] == "oracle":
            ax.annotate(f"B={p['concurrency']}", (p["interactivity"], p["throughput"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")
    _live_points(ax, sim, policies, colors)
    ax.set(xscale="linear", yscale="log", xlabel="interactivity (tokens/s per request)",
           ylabel="throughput (tokens/s, all requests)",
           title=f"Throughput vs interactivity, B = 1..64 ({sim['costs']['kind']} costs)"
                 f"{chr(10) + 'UNRELIABLE cost table: see the report' if sim['costs'].get('warnings') else ''}")
    ax.legend(fontsize=6, ncol=2)
    refits = sim.get("cost_refits") or 0
    add_caption(fig, report, f"   costs: {Path(sim['costs']['path']).name} ({sim['costs']['kind']})"
                + (f"; whiskers: 95 % over {refits} refits of the cost model" if refits else ""))
    return fig


def _live_points(ax, sim: dict, policies: list[str], colors) -> None:
    """Live runs (``svt evaluate --live``) as crosses in their policy's colour, each labelled with
    its batch size: where the engine landed beside the replay's curve."""
    runs = [r for r in ((sim.get("live") or {}).get("runs") or []) if r.get("live_interactivity")]
    labelled = set()
    for r in runs:
        hvd = r["policy"].startswith("live HVD")  # no replay curve of its own: a marker of its own
        i = policies.index(r["policy"]) if r["policy"] in policies else 0
        label = "live HVD (engine)" if hvd else "live runs (engine), policy's colour"
        ax.plot([r["live_interactivity"]], [r["live_tokens_per_s"]], "*" if hvd else "X",
                color="k" if hvd else colors[i % len(colors)], ms=11 if hvd else 8, mec="k", mew=0.6,
                label=None if label in labelled else label, zorder=5)
        labelled.add(label)
        ax.annotate(f"{'HVD ' if hvd else ''}live B={r['batch_size']}", (r["live_interactivity"], r["live_tokens_per_s"]),
                    fontsize=6, xytext=(4, -8), textcoords="offset points")


def _whiskers(ax, points: list[dict], color) -> None:
    """The cost model's 95 % range of each point (``cost_ci95``), both axes, where the report has it."""
    pts = [p for p in points if (p.get("cost_ci95") or {}).get("throughput") and p["cost_ci95"].get("interactivity")]
    if not pts:
        return
    x = np.array([p["interactivity"] for p in pts])
    y = np.array([p["throughput"] for p in pts])
    xe = np.array([[p["interactivity"] - p["cost_ci95"]["interactivity"][0],
                    p["cost_ci95"]["interactivity"][1] - p["interactivity"]] for p in pts]).T
    ye = np.array([[p["throughput"] - p["cost_ci95"]["throughput"][0],
                    p["cost_ci95"]["throughput"][1] - p["throughput"]] for p in pts]).T
    ax.errorbar(x, y, xerr=np.maximum(xe, 0), yerr=np.maximum(ye, 0), fmt="none", ecolor=color, elinewidth=0.8,
                capsize=2, alpha=0.7)


def coefficients(fit, ax=None):
    """An online fit's slope and intercepts per refit cycle (``fit``: from ``svt.fit.fit_runs`` or
    ``Fitter.load``)."""
    if "coefficients" not in getattr(fit, "plot_kinds", ()):
        raise DataError("Expected an online fit (irls-online) with a coefficient path.")
    fit = fit.record()
    if not fit.get("path"):
        raise DataError("Expected an online fit (irls-online) with a coefficient path.")
    fig, ax = figure_axes(ax, (7.2, 4.6))
    path = fit["path"]
    cyc = [e["cycle"] for e in path]
    slope = np.array([np.atleast_1d(e["slope"]) for e in path])
    inter = np.array([e["intercepts"] for e in path])
    for j in range(slope.shape[1]):  # several slopes: coloured like their intercepts, dashed
        ax.plot(cyc, slope[:, j], color="k" if slope.shape[1] == 1 else palette(slope.shape[1] + 1)[j + 1],
                ls="-" if slope.shape[1] == 1 else "--", lw=1.6 if slope.shape[1] == 1 else 1,
                label="slope" if slope.shape[1] == 1 else f"slope, position {j}")
    for j in range(inter.shape[1]):
        ax.plot(cyc, inter[:, j], color=palette(inter.shape[1] + 1)[j + 1], lw=1, label=f"intercept, position {j}")
    o = fit.get("options", {})
    ax.set(xlabel=f"refit cycle ({o.get('cycle_steps')} decode steps each)", ylabel="coefficient",
           title=f"irls-online on {fit.get('feature')}: coefficient path (damping c = {o.get('damping')})")
    ax.axhline(0, color="0.7", lw=0.6)
    ax.legend(fontsize=7, ncol=2)
    runs = ", ".join(Path(r["path"]).name for r in fit.get("training", {}).get("runs", []))
    fig.supxlabel(f"fitted on: {runs}   labelled drafts: {fit.get('training', {}).get('rows'):,}   "
                  f"svt {fit.get('svt_version')}", fontsize=7, color="0.35")
    return fig


def features(report: dict, ax=None):
    """The feature table as a dot plot: AUC overall and excluding the first position."""
    feats = report["features"]
    if not feats:
        raise DataError("The report has no acceptance feature to draw (a run without model drafts).")
    fig, ax = figure_axes(ax, (7.2, 1.6 + 0.38 * len(feats)))
    names = list(feats)[::-1]
    y = np.arange(len(names))
    ax.scatter([np.nan if feats[n]["auc"] is None else feats[n]["auc"] for n in names], y, color="k",
               label="all positions", zorder=3)
    ax.scatter([np.nan if feats[n]["excluding_first"]["auc"] is None else feats[n]["excluding_first"]["auc"]
                for n in names], y, marker="s", facecolors="none", edgecolors="C3",
               label="excluding the first position", zorder=3)
    labels = [f"{shown(n, feats[n])}{'' if feats[n]['lossless'] else '  (lossy)'}" for n in names]
    ax.axvline(0.5, color="0.5", lw=0.8, ls="--")
    ax.set(yticks=y, yticklabels=labels, xlabel="AUC (hard labels; 0.5 = chance)\n−name: scored negated (lower = accept)",
           title="Acceptance features")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower left", framealpha=0.9)  # the points sit right of chance
    add_caption(fig, report)
    return fig



PLOTS = {"reliability": reliability, "roc": roc, "per-position": per_position, "pareto": pareto,
         "coefficients": coefficients, "features": features, "hvd": hvd, "yield-pr": yield_pr,
         "hvd-map": hvd_map, "tree-budget": tree_budget, "tree-calibration": tree_calibration}
TREE_PLOTS = ("tree-budget", "tree-calibration")


def get_plot(name: str):
    """The figure function of ``name``, wrapped so that the wrong kind of input (a fit file for a
    report figure, or a report without what the figure draws) is one clear error."""
    try:
        fn = PLOTS[name]
    except KeyError:
        raise ConfigError(f"Unknown plot kind {name!r}; known kinds: {', '.join(PLOTS)}, all.") from None

    def checked(data, ax=None, **options):
        from svt.fit import Fitter

        wants_fit = name == "coefficients"
        is_fit = isinstance(data, Fitter)
        is_report = isinstance(data, dict) and ("features" in data or data.get("kind") == "trees") and "runs" in data
        if wants_fit and not is_fit:
            raise DataError("`coefficients` draws a fit file from `svt fit` (an irls-online fit).")
        if is_report and data.get("kind") == "cache-only" and name not in ("hvd", "yield-pr", "hvd-map"):
            raise DataError(f"`{name}` draws acceptance features; this report is of runs without model drafts "
                            "(cache drafts only). Its figures: hvd, yield-pr, hvd-map.")
        if is_report and (data.get("kind") == "trees") != (name in TREE_PLOTS):
            raise DataError(f"`{name}` draws " + ("a tree run's report; this one is of chain runs."
                                                  if name in TREE_PLOTS else "chain drafts; this report is of a "
                                                  "tree run. Its figures: " + ", ".join(TREE_PLOTS) + "."))
        if not wants_fit and not is_report:
            raise DataError(f"`{name}` draws a report from `svt evaluate` (its directory or report.json), "
                            "not " + ("a fit file." if is_fit else "this file."))
        try:
            return fn(data, ax=ax, **options)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise DataError(f"The input lacks what `{name}` draws ({type(exc).__name__}: {exc}); "
                            "re-run `svt evaluate` with the options that compute it.") from None

    return checked


def read_input(path: str | Path):
    """A report (its directory or report.json; a dict) or a fit file (its fitter)."""
    from svt.fit import Fitter
    from svt.fit.files import is_fit_file

    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    if is_fit_file(path):
        return Fitter.load(path)
    return read_json(path, "Report or fit file (a report directory, report.json or a fit file)")


class UnreadableFigure(UserWarning):
    """A figure a reader would stumble on (see :mod:`svt.plots.readability`)."""


def save(fig, out: str | Path) -> Path:
    """Write ``fig`` (``.png`` or ``.svg``) after a reader's look: each problem it finds (text cut
    off, two series drawn alike, a legend over the data) is an ``UnreadableFigure`` warning."""
    import warnings

    from svt.plots.readability import problems

    out = Path(out)
    if out.suffix.lower() not in (".png", ".svg"):
        raise ConfigError(f"Expected an output file ending in .png or .svg, but got {out.name!r}.")
    out.parent.mkdir(parents=True, exist_ok=True)
    for problem in problems(fig):
        warnings.warn(f"{out.name}: {problem}", UnreadableFigure, stacklevel=2)
    fig.savefig(out, dpi=150)
    plt.close(fig)
    return out


def plot_all(report_dir: str | Path, fits: list[str | Path] = (), vmax: float | None = None) -> list[Path]:
    """Every figure a report (and online fits) allows, into REPORT_DIR/figures/*.png (``vmax``: the
    HVD map's colour scale, in %)."""
    report_dir = Path(report_dir)
    report = read_input(report_dir)
    out = []
    kinds = ("features", "roc", "reliability", "per-position", "pareto", "hvd", "yield-pr", "hvd-map")
    if report.get("kind") == "cache-only":  # no acceptance features: only the cache figures
        kinds = ("hvd", "yield-pr", "hvd-map")
    if report.get("kind") == "trees":
        kinds = TREE_PLOTS
    for kind in kinds:
        try:
            fig = PLOTS[kind](report, vmax=vmax) if kind == "hvd-map" else PLOTS[kind](report)
            out.append(save(fig, report_dir / "figures" / f"{kind}.png"))
        except DataError:
            continue
    from svt.fit import Fitter

    for fit_path in fits:
        fit = Fitter.load(fit_path)
        if "coefficients" in fit.plot_kinds:
            out.append(save(coefficients(fit), report_dir / "figures" / f"coefficients-{Path(fit_path).stem}.png"))
    return out
