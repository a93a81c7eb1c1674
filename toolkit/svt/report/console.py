"""Tables for the terminal (rich): the CLI prints these, notebooks can too.

Nothing is cut: every column folds instead of ending in an ellipsis, and cells are plain text (a
policy named ``AV q_max [engine rule]`` is not read as rich markup). Off a terminal the CLI's console
is wide enough that tables keep their natural width.
"""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from svt.report.render import feature_rows, fmt

SHORT = ("auc", "log_loss", "ece", "brier", "n")  # the terminal's feature table; report.md has them all


def new_table(*headers: str, title: str | None = None) -> Table:
    """A table whose columns fold long values rather than cutting them."""
    table = Table(title=escape(title) if title else None)
    for h in headers:
        table.add_column(escape(h), overflow="fold")
    return table


def add_row(table: Table, *cells) -> None:
    table.add_row(*(Text(str(c)) for c in cells))


def feature_tables(report: dict) -> list[Table]:
    from svt.report.render import HEAD

    keep = [0, 1, *(2 + HEAD.index(k) for k in SHORT)]
    tables = []
    for title, scope in (("all positions", None), ("excluding the first position", "excluding_first")):
        t = new_table("feature", "lossless", *SHORT, title=f"acceptance features: {title}")
        for row in feature_rows(report["features"], scope, ci=False):
            add_row(t, *(row[i] for i in keep))
        tables.append(t)
    return tables


def direction_legend(report: dict) -> str | None:
    negated = [f.get("shown_as") for f in report["features"].values() if f.get("direction") == -1]
    if not negated:
        return None
    return (f"{', '.join(negated)}: lower values mean acceptance, so these are scored negated and every "
            "AUC reads higher = better (raw AUC = 1 - AUC, kept in report.json as auc_raw).")


def simulation_table(report: dict, concurrency=(1, 8, 64)) -> Table:
    sim = report["simulation"]
    t = new_table("policy", "B", "tokens/step", "step ms", "tok/s per request", "tok/s total", "Pareto",
                  title=f"Adaptive Verification replay ({sim['costs']['kind']} costs)")
    for p in sim["points"]:
        if p["concurrency"] in concurrency:
            add_row(t, p["policy"], p["concurrency"], f"{p['tokens_per_step']:.3f}", f"{p['step_ms']:.2f}",
                    f"{p['interactivity']:,.0f}", f"{p['throughput']:,.0f}",
                    "bound" if p["pareto"] is None else ("yes" if p["pareto"] else ""))
    return t


def yield_table(report: dict) -> Table:
    yl = report["yield"]
    t = new_table("predictor", "MSE", "MAE", "precision", "recall", "F1", "AP",
                  title=f"yield predictors: high yield >= {yl['high_yield']} ({yl['requests']} requests)")
    for n, b in yl["predictors"].items():
        add_row(t, n, *(fmt(b[k], 3) for k in ("mse", "mae", "precision", "recall", "f1", "average_precision")))
    return t


def hvd_table(report: dict) -> Table:
    hv = report["hvd"]
    t = new_table("group", "policy", "cycles/1000", "speed-up vs greedy", "vs model-only",
                  title=f"Hybrid Verified Decoding replay ({hv['costs']['kind']} costs, batch 1)")
    for r in hv["rows"]:
        if "predictor" not in r:
            add_row(t, r["group"], r["policy"], f"{r['cycles_per_1000']:.1f}", f"{r['speedup_vs_greedy']:.3f}",
                    f"{r['speedup_vs_model']:.3f}")
    for b in hv["best"]:
        add_row(t, b["group"], f"hvd {b['predictor']} best τ={b['tau']:g}", f"{b['cycles_per_1000']:.1f}",
                f"{b['speedup_vs_greedy']:.3f}", f"{b['speedup_vs_model']:.3f}")
    return t


def evaluate_tables(report: dict) -> list:
    """What `svt evaluate` prints: tables and legend lines, in order."""
    if report.get("kind") == "cache-only":
        items: list = [Text(report["note"])]
        if report.get("yield"):
            items.append(yield_table(report))
        if report.get("hvd"):
            items.append(hvd_table(report))
        return items
    items = [*feature_tables(report)]
    legend = direction_legend(report)
    if legend:
        items.append(Text(legend))
    if report.get("simulation"):
        items.append(simulation_table(report))
    if report.get("yield"):
        items.append(yield_table(report))
    if report.get("hvd"):
        items.append(hvd_table(report))
    return items


def regression_table(result: dict, top: int = 15) -> Table:
    """The regressions first, then the metrics nearest to their threshold (regression.md has all)."""
    from svt.report.compare import MARK, format_number, threshold_text

    rows = result["rows"][:max(top, result["regressed"])]
    t = new_table("section", "predictor / policy", "where", "metric", "baseline", "now", "difference", "threshold",
                  "verdict", title=f"against the baseline: {result['verdict'].upper()} "
                                   f"({result['regressed']} of {result['compared']} regressed)")
    for r in rows:
        diff = "—" if r["difference"] is None else f"{r['difference']:+.4g}"
        add_row(t, r["section"], r["item"], r["where"], f"{r['metric']} {'↑' if r['direction'] == 'higher' else '↓'}",
                format_number(r["baseline"], r["metric"]), format_number(r["now"], r["metric"]), diff, threshold_text(r),
                MARK[r["verdict"]])
    return t
