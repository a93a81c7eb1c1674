"""Quick summaries of a run directory (what `svt inspect` prints)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from svt.metrics.tables import acceptance_by_position as _by_position
from svt.traces.io import open_run


def acceptance_by_position(path: str | Path) -> pl.DataFrame:
    """Acceptance by draft position in both conventions (see ``svt.metrics.tables``)."""
    return _by_position(open_run(path, deep=False, tables=["drafts"]).scan("drafts"))


def run_summary(path: str | Path, *, deep: bool = True) -> dict:
    """Validate a run and return its headline numbers."""
    run = open_run(path, deep=deep)
    d = run.scan("drafts").select(
        pl.len().alias("drafts"),
        pl.col("label").is_not_null().sum().alias("labelled"),
        pl.col("label").mean().alias("acceptance"),
    ).collect().row(0, named=True)
    s = run.scan("steps").select(
        pl.len().alias("steps"), pl.col("accepted").sum().alias("accepted")
    ).collect().row(0, named=True)
    r = run.scan("requests").select(pl.len()).collect().item()
    sampling = run.meta.get("sampling") or {}
    return {
        "status": "complete" if run.complete else
                  f"INCOMPLETE ({run.meta.get('status')}: interrupted; resume it with svt collect --resume)",
        "shards": "verified against run.json" if run.verified else "NOT verified (run.json records no shards)",
        "requests": r,
        "steps": s["steps"],
        "drafts": d["drafts"],
        "labelled": d["labelled"],
        "acceptance": round(d["acceptance"], 4) if d["acceptance"] is not None else None,
        # mean acceptance length counts the bonus/resampled token: 1 + accepted per step
        "mean_acceptance_length": round(1 + s["accepted"] / s["steps"], 4) if s["steps"] else None,
        "temperature": sampling.get("temperature"),
        "top_p": sampling.get("top_p"),
        "k": run.meta.get("k"),
        **{t: run.scan(t).select(pl.len()).collect().item() for t in ("cache_drafts", "cache_trees") if run.has(t)},
        **({"imported": _imported(run.meta["import"])} if isinstance(run.meta.get("import"), dict) else {}),
    }


def _imported(imp: dict) -> str:
    """One line on an imported run: its format and source, what it lacks and cannot give."""
    lacks = "; ".join(f"{t}: {', '.join(c)}" for t, c in (imp.get("lacks") or {}).items())
    cannot = "; ".join(imp.get("cannot_study") or [])
    return (f"imported ({imp.get('format')}) from {imp.get('source')}; lacks {lacks or 'nothing'}"
            + (f". Cannot study: {cannot}." if cannot else "."))


def run_tree(path: str | Path) -> dict | None:
    """A tree run's headline (None for chain runs): its shape and totals, and its nodes by depth
    (None for an imported tree run, which has counts per step only)."""
    run = open_run(path, deep=False)
    tree = run.meta.get("tree")
    if not tree:
        return None
    st = run.scan("steps").select(pl.len(), pl.col("drafted").cast(pl.Int64).sum(),
                                  pl.col("accepted").cast(pl.Int64).sum()).collect().row(0)
    steps, nodes, acc = st[0], st[1] or 0, st[2] or 0  # from the tables: an interrupted run has no totals yet
    line = (f"a tree run ({tree.get('shape')}): {nodes:,} nodes over {steps:,} steps, "
            f"{acc / max(steps, 1):.3f} accepted per step, {acc / max(nodes, 1):.4f} per node")
    if not run.has("tree_drafts"):
        return {"line": line + " (counts per step, no per-node rows)", "by_depth": None}
    from svt.report.trees import by_depth

    return {"line": line, "by_depth": by_depth(run.scan("tree_drafts").collect())}
