"""Loading cache-draft rows for yield fitters and evaluation (``cache_drafts`` of greedy runs)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from svt.errors import DataError
from svt.traces.io import open_run


def load_cache_drafts_for_fit(runs: list[str | Path], where: pl.Expr | None = None,
                              with_empty: bool = False) -> tuple[pl.DataFrame, list[dict]]:
    """Cache-draft rows of the runs (with ``_run``), sorted by run, request and decode position;
    only rows with a draft unless ``with_empty``."""
    frames, infos = [], []
    for i, path in enumerate(runs):
        run = open_run(path)
        if not run.has("cache_drafts"):
            raise DataError(f"{path}: no `cache_drafts` table; collect a greedy run with `cache: true` "
                            "or add it with `svt cache RUN`.")
        frames.append(run.scan("cache_drafts").with_columns(pl.lit(i).alias("_run")))
        infos.append({"path": str(path), "run_id": run.meta.get("run_id"), "k": run.meta.get("k")})
    lf = pl.concat(frames)
    if where is not None:
        lf = lf.filter(where)
    if not with_empty:
        lf = lf.filter(pl.col("draft_len") > 0)
    rows = lf.sort("_run", "request", "decode_pos").collect()
    if rows.height == 0:
        raise DataError("No cache drafts to fit on: the cache proposed nothing"
                        + (" after the filter." if where is not None else "."))
    return rows, infos
