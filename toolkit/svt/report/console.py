"""Tables for the terminal (rich): the CLI prints these, notebooks can too.

Nothing is cut: every column folds instead of ending in an ellipsis, and cells are plain text (a
policy named ``AV q_max [engine rule]`` is not read as rich markup). Off a terminal the CLI's console
is wide enough that tables keep their natural width.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from svt.report.judge import MARK, format_number, threshold_text
from svt.report.sections import SECTIONS
from svt.report.text import add_row, new_table


def evaluate_tables(report: dict) -> list:
    """What `svt evaluate` prints: each section's tables and legend lines, in order."""
    items: list = []
    if report.get("kind") == "trees":
        from svt.report.trees_text import tree_console

        return tree_console(report)
    if report.get("kind") == "cache-only":
        items.append(Text(report["note"]))
    for section in SECTIONS:
        if report.get("kind") != "cache-only" or section.name == "yield and HVD replay":
            items += section.console(report)
    return items


def regression_table(result: dict, top: int = 15) -> Table:
    """The regressions first, then the metrics nearest to their threshold (regression.md has all)."""
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
