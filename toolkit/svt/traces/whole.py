"""A run checked as a whole: the facts that tie its steps to its requests and its tables to run.json.

Each table can pass its own checks while the run they make is impossible. What is checked here:

- **run.json against the tables** (:func:`check_counts`, on every read, from the Parquet footers):
  ``counts`` of requests, steps, drafts, cache drafts, cache trees and tree drafts equal the rows
  of those tables, and a run collected by svt holds one shard per batch (``batches``, or the
  batches of its shard of a sharded collection);
- **the steps** (:func:`steps_problem`, with the other cross-table checks): one row per (request,
  step); no step decodes more rows than the run's batch size; and in a run svt collected, every
  step emitting at least one token (the target's own), and every step but a request's last
  exactly its accepted drafts + 1 (only the end of a request cuts a step short), a request's steps
  numbered without gaps (from 0 in a static batch, engine ticks in a continuous one, where a
  request decodes at every tick from its admission to its end) and its emitted tokens adding up to
  its output's length (the engine appends to an output only what its steps emit), every request
  having steps, every output ended by ``stop`` or ``length``, and an output ended by ``length`` as
  long as ``max_new_tokens``. An import keeps
  its source's steps;
- **the run as a whole** (:func:`run_problem`, on one machine and on the cluster alike): one
  requests row per request; in a run with an engine ``schedule`` table, one row per tick, and each
  tick decoding as many rows and emitting as many tokens as the steps logged at it (a continuous
  run's steps are its ticks; a static run's shards pair by name, each batch's ticks from 0; not in
  a resumed run, whose first session's ticks also decoded requests the second redid).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from svt.errors import SchemaError

# how svt's engine ends an output: a stop token, or max_new_tokens
FINISH_REASONS = ("stop", "length")
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
    if meta.get("status", "complete") != "complete":  # a run that does not say is read as complete
        return
    counts = meta.get("counts") if isinstance(meta.get("counts"), dict) else {}
    for table in COUNTED:
        said = counts.get(table)
        # an optional table removed whole (hidden states, cache drafts: to save space) is absent, not damaged
        if said is None or not run.has(table):
            continue
        if not _int(said) or said < 0:
            raise SchemaError(f"{Path(run.path)}: run.json's counts.{table} is {said!r}: expected a whole number of "
                              "rows.")
        rows = run.rows(table)
        if rows != said:
            raise SchemaError(f"{Path(run.path)}: run.json counts {said:,} rows of `{table}` but its shards hold "
                              f"{rows:,}: the run was edited or damaged after it was written (collect it again, or "
                              "restore the missing shards).")
    batches = meta.get("batches")
    shard = meta.get("shard") if isinstance(meta.get("shard"), dict) else None
    if shard is not None and isinstance(shard.get("batches"), list):
        batches = len(shard["batches"])
    if batches is not None and (not _int(batches) or batches < 0):
        raise SchemaError(f"{Path(run.path)}: run.json's batches is {batches!r}: expected a whole number.")
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
        (pl.col("emitted") < 1).sum().alias("_silent"),
        # every step but the request's last emits its accepted drafts and the target's token
        ((pl.col("emitted") != pl.col("accepted") + 1) & (pl.col("step") != pl.col("step").max())).sum().alias("_short"))
    cfg = meta.get("config") if isinstance(meta.get("config"), dict) else {}
    batch = cfg.get("batch_size")
    schedule = meta.get("schedule") if isinstance(meta.get("schedule"), dict) else {}
    static = schedule.get("kind", "static") == "static"
    checks = [(pl.col("_u") != pl.col("_n"), "a (request, step) pair held twice")]
    # (an import keeps its source's steps as they were: a vLLM spool's lost flush leaves a gap, which its
    # run.json says; an arctic simulation logs a step that accepted nothing at a response's end)
    if collected_by_svt(meta):
        checks.append((pl.col("_silent") > 0, "a step that emits no token (every step emits at least the target's own)"))
        checks.append((pl.col("_short") > 0, "a step before the request's last emitting other than its accepted drafts "
                                             "+ 1 (only a request's end cuts a step short)"))
        checks.append((pl.col("_hi") - pl.col("_lo") + 1 != pl.col("_u"), "step numbers with gaps"))
        if static and not meta.get("hvd"):
            checks.append((pl.col("_lo") != 0, "steps not numbered from 0 (a static batch numbers them from 0)"))
    j = g
    if requests is not None and collected_by_svt(meta):
        out = requests.select("request", pl.col("output_ids").list.len().cast(pl.Int64).alias("_out"))
        # from the requests' side too: a request whose steps are all gone has an output and no steps
        j = g.join(out, on="request", how="full", coalesce=True).with_columns(
            pl.col("_n").fill_null(0), pl.col("_emitted").fill_null(0))
        checks.append((pl.col("_out").is_not_null() & (pl.col("_emitted") != pl.col("_out")),
                       "emitted tokens that do not add up to the request's output length"))
        j = j.join(requests.select("request", pl.col("finish_reason").alias("_fin")), on="request", how="left")
        # svt's engine ends an output at a stop token or at max_new_tokens, and says which
        checks.append((pl.col("_out").is_not_null() & ~pl.col("_fin").is_in(list(FINISH_REASONS)).fill_null(False),
                       f"a finish_reason other than {' or '.join(FINISH_REASONS)}"))
        top = cfg.get("max_new_tokens")
        if _int(top) and top >= 1 and not meta.get("hvd"):
            checks.append(((pl.col("_fin") == "length") & (pl.col("_out") != top),
                           f"an output ended by `length` other than max_new_tokens ({top}) tokens long"))
    counts = j.select([c.fill_null(False).sum().alias(str(i)) for i, (c, _) in enumerate(checks)]).collect().row(0)
    for n, (cond, what) in zip(counts, checks, strict=True):
        if n:
            cols = ["request", "_n", "_lo", "_hi", "_emitted"] + (["_out"] if "_out" in j.collect_schema().names() else [])
            r = j.filter(cond.fill_null(False)).select(cols).sort("request").head(1).collect().row(0, named=True)
            detail = (f"{r['_n']} step rows numbered {r['_lo']}..{r['_hi']}, emitting {r['_emitted']} token(s)"
                      if r["_n"] else "no step rows") + (f" for an output of {r['_out']}" if r.get("_out") is not None else "")
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


def run_problem(run) -> str | None:
    """The checks that need whole tables (see the module docstring), on one machine and on the
    cluster: requests held once, and the engine's schedule against the steps logged at each tick."""
    if run.has("requests"):
        twice = (run.scan("requests").group_by("request").len().filter(pl.col("len") > 1)
                 .sort("request").head(1).collect())
        if twice.height:
            return f"the requests table holds request {twice['request'][0]} {twice['len'][0]} times"
    if not (run.has("schedule") and run.has("steps")):
        return None
    sched_meta = run.meta.get("schedule") if isinstance(run.meta.get("schedule"), dict) else {}
    if sched_meta.get("resumed"):  # the first session's ticks also ran requests the resumed one redid
        return None
    kind = sched_meta.get("kind", "static")
    if kind == "continuous":
        return _ticks_problem(run.scan("schedule"), run.scan("steps"), ["tick"])
    # a static run: batch b's shard holds its ticks from 0; its requests are b * B .. b * B + B - 1
    size = (run.meta.get("config") or {}).get("batch_size")
    if not _int(size) or size < 1:
        return None
    # shards are named part-NNNNN.parquet by batch (the reader refuses any other name)
    sched = pl.concat([part.with_columns(pl.lit(int(f.name[5:10])).alias("_batch"))
                       for f, part in zip(run.shards["schedule"], run.parts("schedule"), strict=True)])
    steps = run.scan("steps").with_columns((pl.col("request") // size).alias("_batch"))
    return _ticks_problem(sched, steps, ["_batch", "tick"])


def _ticks_problem(sched: pl.LazyFrame, steps: pl.LazyFrame, key: list[str]) -> str | None:
    s = sched.group_by(key).agg(pl.len().alias("_k"), pl.col("batch_size").cast(pl.Int64).sum().alias("_rows"),
                                pl.col("emitted").cast(pl.Int64).sum().alias("_tok"))
    t = steps.rename({"step": "tick"}).group_by(key).agg(pl.len().alias("_n"),
                                                         pl.col("emitted").cast(pl.Int64).sum().alias("_em"))
    j = s.join(t, on=key, how="full", coalesce=True).sort(key)
    checks = [(pl.col("_k") > 1, "an engine tick held more than once"),
              (pl.col("_k").is_null(), "steps logged at a tick the schedule table does not hold"),
              (pl.col("_n").fill_null(0) != pl.col("_rows"), "a tick decoding another number of rows than the steps "
                                                              "logged at it"),
              (pl.col("_em").fill_null(0) != pl.col("_tok"), "a tick emitting another number of tokens than the steps "
                                                              "logged at it")]
    counts = j.select([c.fill_null(False).sum().alias(str(i)) for i, (c, _) in enumerate(checks)]).collect().row(0)
    for n, (cond, what) in zip(counts, checks, strict=True):
        if n:
            r = j.filter(cond.fill_null(False)).head(1).collect().row(0, named=True)
            at = f"batch {r['_batch']} tick {r['tick']}" if "_batch" in r else f"tick {r['tick']}"
            return (f"the schedule and steps tables disagree: {n} tick(s) with {what} (first: {at}: "
                    f"{r['_rows']} row(s) and {r['_tok']} token(s) in the schedule, {r['_n'] or 0} step row(s) emitting "
                    f"{r['_em'] or 0} in the steps)")
    return None
