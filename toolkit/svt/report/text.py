"""How reports print: numbers and tables as markdown (report.md) and for the terminal (rich)."""

from __future__ import annotations

import math

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from svt.metrics.specs import names

# the columns of report.md's feature tables, those with a bootstrap interval, the terminal's columns
HEAD = names("table", report=True)
WITH_CI = names("table", compared=True)
SHORT = names("table", console=True)


def fmt(v, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def ci_text(block: dict, key: str) -> str:
    ci = block.get("ci95", {}).get(key)
    return f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else ""


def with_request_ci(row: dict, key: str, digits: int = 3) -> str:
    """A replay row's value with its request-bootstrap range (``request_ci95``) where it has one."""
    ci = (row.get("request_ci95") or {}).get(key)
    return fmt(row.get(key), digits) + (f" [{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]" if ci else "")


def feature_rows(features: dict, scope: str | None = None, ci: bool = True) -> list[list[str]]:
    """One row per feature: name, lossless, then the HEAD metrics of ``scope`` (None = overall)."""
    rows = []
    for name, f in features.items():
        block = f if scope is None else f[scope]
        rows.append([shown(name, f), fmt(f["lossless"]), *(fmt(block.get(k)) + (ci_text(block, k) if ci and k in WITH_CI else "") for k in HEAD)])
    return rows


def shown(name: str, block: dict) -> str:
    """How a feature is named in tables and figures: ``−entropy`` for a feature scored negated."""
    return block.get("shown_as") or name


DIRECTION_NOTE = ("`−name`: a feature whose lower values mean acceptance (e.g. entropy) is scored negated, "
                  "so every AUC reads higher = better; report.json keeps the raw value's AUC as `auc_raw` "
                  "(= 1 − AUC).")


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def new_table(*headers: str, title: str | None = None) -> Table:
    """A table whose columns fold long values rather than cutting them."""
    table = Table(title=escape(title) if title else None)
    for h in headers:
        table.add_column(escape(h), overflow="fold")
    return table


def add_row(table: Table, *cells) -> None:
    table.add_row(*(Text(str(c)) for c in cells))


def cost_warnings(costs: dict) -> list[str]:
    """The report's line when the cost table says it may not be the machine's (svt collect
    --profile-costs on a busy or noisy machine): its replays are not to be trusted."""
    w = costs.get("warnings") or []
    return [f"**The cost table is unreliable** ({'; '.join(w)}): the replay's speeds may describe a busy machine, "
            "not this pair. Profile again on a quiet machine (`svt collect CONFIG --profile-costs`).\n"] if w else []
