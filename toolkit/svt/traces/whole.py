"""A run checked as a whole: the facts that tie its steps to its requests and its tables to run.json.

Each table can pass its own checks while the run they make is impossible. What is checked here:

- **run.json against the tables** (:func:`check_counts`, on every read, from the Parquet footers):
  ``counts`` of requests, steps, drafts, cache drafts, cache trees and tree drafts equal the rows
  of those tables, and a run collected by svt holds one shard per batch (``batches``, or the
  batches of its shard of a sharded collection);
- **the steps** (:func:`steps_problem`, with the other cross-table checks): one row per (request,
  step); no step decodes more rows than the run's batch size; and in a run svt collected, every
  step emitting at least one token (the target's own), a request's steps numbered without gaps
  (from 0 in a static batch, engine ticks in a continuous one, where a request decodes at every
  tick from its admission to its end) and its emitted tokens adding up to its output's length (the
  engine appends to an output only what its steps emit). An import keeps its source's steps.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from svt.errors import SchemaError

# run.json `counts` entries that are row counts of a table
COUNTED = ("requests", "steps", "drafts", "cache_drafts", "cache_trees", "tree_drafts")


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def collected_by_svt(meta: dict) -> bool:
    """A run svt's own engine wrote (not an import, a synthetic run or a reference run)."""
    return ("config" in meta and not meta.get("synthetic") and not meta.get("import")
            and meta.get("engine", "svt") == "svt")


def check_counts(run) -> None:
    """run.json's ``counts`` and ``batches`` against the tables of a complete run (one SchemaError
    naming the run, the table and both numbers)."""
    meta = run.meta
    if meta.get("status") != "complete":
        return
    counts = meta.get("counts") if isinstance(meta.get("counts"), dict) else {}
    for table in COUNTED:
        said = counts.get(table)
        # an optional table removed whole (hidden states, cache drafts: to save space) is absent, not damaged
        if not _int(said) or not run.has(table):
            continue
        rows = run.rows(table)
        if rows != said:
            raise SchemaError(f"{Path(run.path)}: run.json counts {said:,} rows of `{table}` but its shards hold "
                              f"{rows:,}: the run was edited or damaged after it was written (collect it again, or "
                              "restore the missing shards).")
    batches = meta.get("batches")
    shard = meta.get("shard") if isinstance(meta.get("shard"), dict) else None
    if shard is not None and isinstance(shard.get("batches"), list):
        batches = len(shard["batches"])
    if collected_by_svt(meta) and _int(batches) and "requests" in run.shards:
        n = len(run.shards["requests"])
        if n != batches:
            raise SchemaError(f"{Path(run.path)}: run.json says {batches} batch(es), but the `requests` table has "
                              f"{n} shard(s) (svt writes one per batch): whole batches were removed or added.")


def steps_problem(meta: dict, steps: pl.LazyFrame, requests: pl.LazyFrame | None) -> str | None:
    """The first impossible fact about the steps (see the module docstring), in words naming the
    table and the first offending request, or None. ``requests``: the requests whose outputs the
    steps must add up to (None: not checked)."""
    g = steps.group_by("request").agg(
        pl.len().alias("_n"), pl.col("step").n_unique().alias("_u"), pl.col("step").min().alias("_lo"),
        pl.col("step").max().alias("_hi"), pl.col("emitted").cast(pl.Int64).sum().alias("_emitted"),
        (pl.col("emitted") < 1).sum().alias("_silent"))
    cfg = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    batch = cfg.get("batch_size")
    schedule = meta.get("schedule") if isinstance(meta.get("schedule"), dict) else {}
    static = schedule.get("kind", "static") == "static"
    checks = [(pl.col("_u") != pl.col("_n"), "a (request, step) pair held twice")]
    # (an import keeps its source's steps as they were: a vLLM spool's lost flush leaves a gap, which its
    # run.json says; an arctic simulation logs a step that accepted nothing at a response's end)
    if collected_by_svt(meta):
        checks.append((pl.col("_silent") > 0, "a step that emits no token (every step emits at least the target's own)"))
        checks.append((pl.col("_hi") - pl.col("_lo") + 1 != pl.col("_u"), "step numbers with gaps"))
        if static and not meta.get("hvd"):
            checks.append((pl.col("_lo") != 0, "steps not numbered from 0 (a static batch numbers them from 0)"))
    j = g
    if requests is not None and collected_by_svt(meta):
        out = requests.select("request", pl.col("output_ids").list.len().cast(pl.Int64).alias("_out"))
        j = g.join(out, on="request", how="left")
        checks.append((pl.col("_out").is_not_null() & (pl.col("_emitted") != pl.col("_out")),
                       "emitted tokens that do not add up to the request's output length"))
    counts = j.select([c.fill_null(False).sum().alias(str(i)) for i, (c, _) in enumerate(checks)]).collect().row(0)
    for n, (cond, what) in zip(counts, checks, strict=True):
        if n:
            cols = ["request", "_n", "_lo", "_hi", "_emitted"] + (["_out"] if "emitted tokens" in what else [])
            r = j.filter(cond.fill_null(False)).select(cols).sort("request").head(1).collect().row(0, named=True)
            detail = (f"{r['_n']} step rows numbered {r['_lo']}..{r['_hi']}, emitting {r['_emitted']} token(s)"
                      + (f" for an output of {r['_out']}" if "_out" in r else ""))
            return f"the steps table has {n} request(s) with {what} (first: request {r['request']}: {detail})"
    if _int(batch) and batch >= 1:
        over = steps.filter(pl.col("batch_size") > batch).select("request", "step", "batch_size").head(1).collect()
        if over.height:
            r = over.row(0, named=True)
            return (f"the steps table has a step decoding {r['batch_size']} rows, above the run's batch size {batch} "
                    f"(first: request {r['request']} step {r['step']})")
    return None


def schedule_problem(meta: dict, schedule: pl.LazyFrame) -> str | None:
    """An engine step decoding more rows than the run's slots."""
    slots = (meta.get("schedule") or {}).get("slots") if isinstance(meta.get("schedule"), dict) else None
    if not _int(slots) or slots < 1:
        return None
    over = schedule.filter(pl.col("batch_size") > slots).select("tick", "batch_size").head(1).collect()
    if over.height:
        r = over.row(0, named=True)
        return f"the schedule table has tick {r['tick']} decoding {r['batch_size']} rows, above the run's {slots} slots"
    return None
