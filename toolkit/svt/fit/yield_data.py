"""Loading cache-draft rows for yield fitters and evaluation (``cache_drafts`` of greedy runs)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from svt.errors import DataError
from svt.traces.identity import run_record
from svt.traces.io import open_runs


def load_cache_drafts_for_fit(runs: list[str | Path], where: pl.Expr | None = None,
                              with_empty: bool = False) -> tuple[pl.DataFrame, list[dict]]:
    """Cache-draft rows of the runs (with ``_run``), sorted by run, request and decode position;
    only rows with a draft unless ``with_empty``."""
    frames, infos = [], []
    for i, (path, run) in enumerate(zip(runs, open_runs(runs), strict=True)):
        if not run.has("cache_drafts"):
            raise DataError(f"{path}: no `cache_drafts` table; collect a greedy run with `cache: true` "
                            "or add it with `svt cache RUN`.")
        frame = run.scan("cache_drafts").collect()
        check_cache_drafts(path, run, frame)
        frames.append(frame.lazy().with_columns(pl.lit(i).alias("_run")))
        infos.append(run_record(path, run))
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


def check_cache_drafts(path, run, frame: pl.DataFrame, *, whole: bool = True) -> None:
    """Cross-check a run's cache drafts with its requests: a complete greedy run without AV; one row
    per request and decode position 0..len(output)-1; ``oracle_accepted`` equal to the common
    prefix of the draft with the real continuation; ``model_accepted`` at most K and the tokens
    left. Damaged or mismatched tables are an error, not a different number. ``whole=False``: the
    frame is one shard of the table (each request whole in it), checked row by row; the caller
    checks that the shards together cover the requests (:func:`check_cache_coverage`)."""
    import numpy as np

    from svt.metrics.repetition import common_prefix

    meta = run.meta
    if not (meta.get("sampling") or {}).get("greedy") or meta.get("av"):
        raise DataError(f"{path}: cache drafts belong to a greedy run without live AV; this run is not one "
                        "(oracle yields would be meaningless).")
    if meta.get("status") != "complete":
        raise DataError(f"{path}: the run is not complete (status {meta.get('status')!r}).")
    k = meta.get("k")
    if not isinstance(k, int) or k < 1:
        raise DataError(f"{path}: run.json has no valid `k`.")
    reqs = run.scan("requests").select("request", "output_ids").collect()
    n_out = dict(zip(reqs["request"].to_list(), reqs["output_ids"].list.len().to_list(), strict=True))
    per = frame.group_by("request").agg(pl.len().alias("n"), pl.col("decode_pos").min().alias("lo"),
                                        pl.col("decode_pos").max().alias("hi"),
                                        pl.col("decode_pos").n_unique().alias("u"))
    # svt's own replay has a row at every decode position; an engine's (vLLM's suffix method) only
    # where the engine proposed: distinct positions within the output
    engine = meta.get("engine", "svt") != "svt"
    for r in per.iter_rows(named=True):
        n = n_out.get(r["request"])
        if n is None:
            raise DataError(f"{path}: cache_drafts has request {r['request']}, which the requests table lacks.")
        if engine:
            if not (r["n"] == r["u"] and r["lo"] >= 0 and r["hi"] <= n - 1):
                raise DataError(f"{path}: request {r['request']} has {r['n']} cache rows over positions "
                                f"{r['lo']}..{r['hi']} ({r['u']} distinct), but its output has {n} tokens.")
            continue
        if not (r["n"] == r["u"] == n and r["lo"] == 0 and r["hi"] == n - 1):
            raise DataError(f"{path}: request {r['request']} has {r['n']} cache rows over positions "
                            f"{r['lo']}..{r['hi']}, but its output has {n} tokens (one row per position expected).")
    if whole:
        check_cache_coverage(path, run, set(per["request"].to_list()), n_out)
    outputs = dict(zip(reqs["request"].to_list(), reqs["output_ids"].to_list(), strict=True))
    for r, t, ids, y, m in frame.select("request", "decode_pos", "draft_ids", "oracle_accepted",
                                        "model_accepted").iter_rows():
        out = outputs[r]
        if y != common_prefix(np.asarray(ids), np.asarray(out[t:])) or m > min(k, len(out) - t):
            raise DataError(f"{path}: request {r} position {t}: its oracle or model yield ({y}, {m}) does not "
                            "match its draft and the request's output.")


def check_cache_coverage(path, run, seen: set, n_out: dict | None = None) -> None:
    """svt's own replay has a cache_drafts row for every request with output (``seen``: the
    requests the table holds)."""
    if run.meta.get("engine", "svt") != "svt":
        return
    if n_out is None:
        reqs = run.scan("requests").select("request", "output_ids").collect()
        n_out = dict(zip(reqs["request"].to_list(), reqs["output_ids"].list.len().to_list(), strict=True))
    missing = set(n_out) - set(seen)
    if any(n_out[m] > 0 for m in missing):
        raise DataError(f"{path}: cache_drafts lacks requests {sorted(missing)[:5]} of the requests table.")


def load_cache_trees(runs: list[str | Path], rows: pl.DataFrame) -> pl.DataFrame:
    """The ``cache_trees`` nodes of the runs (with ``_run`` and ``beyond``: deeper than the response
    goes), cross-checked with the runs' cache drafts (``rows``, from
    :func:`load_cache_drafts_for_fit` with ``with_empty``) and outputs: every tree at a position the
    cache_drafts table has, one score, match length, source and lookup per tree, its score the sum
    of its probabilities, and its labels greedy verification against the output."""
    import numpy as np

    from svt.trees.verify import oracle_tree_labels

    frames = []
    for i, (path, run) in enumerate(zip(runs, open_runs(runs), strict=True)):
        if not run.has("cache_trees"):
            raise DataError(f"{path}: no `cache_trees` table; add it with `svt cache RUN --set tree=true` "
                            "(or collect with `cache: {tree: true}`).")
        nodes = run.scan("cache_trees").collect().with_columns(pl.lit(i).alias("_run"))
        outputs = dict(run.scan("requests").select("request", "output_ids").collect().iter_rows())
        pos = rows.filter(pl.col("_run") == i).select("request", "decode_pos")
        stray = nodes.select("request", "decode_pos").unique().join(pos, on=["request", "decode_pos"], how="anti")
        if stray.height:
            r = stray.row(0, named=True)
            raise DataError(f"{path}: cache_trees has a tree at request {r['request']} position {r['decode_pos']}, "
                            "where the cache_drafts table has no row.")
        per = nodes.group_by("request", "decode_pos").agg(
            *(pl.col(c).n_unique().alias(c) for c in ("score", "match_len", "from_global", "lookup_ms")),
            pl.col("prob").sum().alias("_sum"), pl.col("score").first().alias("_score"))
        bad = per.filter((pl.max_horizontal("score", "match_len", "from_global", "lookup_ms") > 1)
                         | ((pl.col("_sum") - pl.col("_score")).abs() > 1e-3 * pl.col("_score").abs().clip(1.0)))
        if bad.height:
            r = bad.row(0, named=True)
            raise DataError(f"{path}: the cache tree at request {r['request']} position {r['decode_pos']} has "
                            "per-tree columns that vary across its nodes, or a score other than the sum of its "
                            "node probabilities.")
        beyond = []
        for (r, t), tree in nodes.sort("node").group_by("request", "decode_pos", maintain_order=True):
            cont = np.asarray(outputs[r][t:], dtype=np.int64)
            want = oracle_tree_labels(tree["parent"].to_numpy(), tree["token"].to_numpy(), cont)
            got = tree["label"].fill_null(-1).to_numpy()
            if not np.array_equal(want, got):
                raise DataError(f"{path}: the cache tree at request {r} position {t}: its labels "
                                f"{got.tolist()} are not greedy verification against the output "
                                f"({want.tolist()}).")
            beyond.append(tree.select("request", "decode_pos", "node").with_columns(
                pl.Series("beyond", tree["depth"].to_numpy() >= cont.size)))
        if beyond:
            nodes = nodes.join(pl.concat(beyond), on=["request", "decode_pos", "node"], how="left")
        else:
            nodes = nodes.with_columns(pl.lit(False).alias("beyond"))
        frames.append(nodes)
    return pl.concat(frames).sort("_run", "request", "decode_pos", "node")


def tree_positions(rows: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """``rows`` (every cache_drafts position, with ``_run``) with each position's tree: size, yield
    (accepted nodes), score and lookup time (0, 0, 0 and the chain's lookup where no tree)."""
    trees = nodes.group_by("_run", "request", "decode_pos").agg(
        pl.len().alias("tree_size"), (pl.col("label") == 1).sum().alias("tree_yield"),
        pl.col("score").first().alias("tree_score"), pl.col("lookup_ms").first().alias("tree_lookup_ms"),
        pl.col("from_global").first().alias("tree_from_global"))
    out = rows.join(trees, on=["_run", "request", "decode_pos"], how="left")
    return out.with_columns(pl.col("tree_size").fill_null(0), pl.col("tree_yield").fill_null(0),
                            pl.col("tree_score").fill_null(0.0),
                            pl.col("tree_lookup_ms").fill_null(pl.col("lookup_ms")))
