"""Columns that follow from other columns, checked when a run is read.

Every table of a run holds some figures twice: a step's ``accepted`` is also the number of its
drafts labelled 1, a draft's ``q_sampled`` is one of the probabilities ``q_max`` bounds, a tree
node's accepted path is also its step's ``accepted``. Each table alone can pass its own checks while
the two copies disagree, and then two report tables disagree, or a replay realises more than the run
did. What is checked:

- within a row (every shard, with the value checks): ``q_sampled``, ``q_margin`` <= ``q_max`` and
  ``p_sampled`` <= ``p_max`` (drafts); ``q_token`` <= ``q_max`` and ``path_prob`` <= ``q_token``
  (tree nodes: a path's probability is a product of its nodes' ``q_token``); ``accepted`` <=
  ``kept`` <= ``drafted``, ``emitted`` <= ``accepted`` + 1 and ``explored`` only where ``kept`` =
  ``drafted`` (steps; live AV may keep every draft without exploring);
- across the drafts and steps of a chain run, per step: between ``kept`` and ``drafted`` drafts (svt
  logs every draft, vLLM's spool the verified ones), one per position; the drafts labelled 1 are positions 0 .. ``accepted`` - 1; at most one labelled 0, at
  position ``accepted``, exactly when ``accepted`` < ``kept``; a step without drafts drafted none;
- across the nodes and steps of a tree run, per step: as many nodes as ``drafted``, ``accepted``
  nodes labelled 1; under greedy verification a verified node is accepted exactly when it is the
  target's argmax (``label`` = ``match``).

Shards are compared pair by pair where the tables' shards pair by name (every svt writer: one shard
per batch and table), so the check holds one shard's steps in memory at a time.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from svt.errors import SchemaError
from svt.traces.whole import run_problem, schedule_problem, steps_problem

# float32 values computed from one distribution: a bound may be met exactly, never passed by more
# than rounding
_REL, _ABS = 1e-5, 1e-7


def _above(a: str, b: str) -> pl.Expr:
    return pl.col(a) > pl.col(b) * (1 + _REL) + _ABS


_ENTROPY_WHAT = ("below -ln `q_max` (a distribution whose largest probability is q has entropy at least "
                 "-ln q)")


def _entropy_below_bound() -> pl.Expr:
    """Rows whose entropy is below -ln q_max, beyond float32 rounding of both."""
    bound = -pl.col("q_max").cast(pl.Float64).log()
    return pl.col("q_entropy").cast(pl.Float64) < bound * (1 - 1e-4) - 1e-4


def row_checks(table: str) -> list[tuple[str, pl.Expr, str]]:
    """(column, true on a row breaking it, what is wrong) for the within-row checks of ``table``."""
    if table == "drafts":
        return [("q_sampled", _above("q_sampled", "q_max"), "above `q_max` (the largest probability of its distribution)"),
                ("q_entropy", _entropy_below_bound(), _ENTROPY_WHAT),
                ("q_margin", _above("q_margin", "q_max") | (pl.col("q_margin") < 0),
                 "negative or above `q_max` (a margin is `q_max` minus the second largest probability)"),
                ("p_sampled", _above("p_sampled", "p_max"), "above `p_max` (the largest probability of its distribution)")]
    if table == "tree_drafts":
        return [("q_token", _above("q_token", "q_max"), "above `q_max` (the largest probability of its distribution)"),
                ("q_entropy", _entropy_below_bound(), _ENTROPY_WHAT),
                ("path_prob", _above("path_prob", "q_token"), "above `q_token` (a path's probability is the product "
                                                              "of its nodes' `q_token`)")]
    if table == "steps":
        return [("accepted", pl.col("accepted") > pl.col("kept"), "above `kept` (a trimmed draft is never accepted)"),
                ("kept", pl.col("kept") > pl.col("drafted"), "above `drafted`"),
                ("emitted", pl.col("emitted") > pl.col("accepted") + 1,
                 "above `accepted` + 1 (a step emits its accepted drafts and one token of the target's)"),
                ("explored", pl.col("explored") & (pl.col("kept") != pl.col("drafted")),
                 "true where `kept` < `drafted`: an explored step verifies every draft")]
    return []


def _paired(run, a: str, b: str) -> list[tuple[pl.LazyFrame, pl.LazyFrame]] | None:
    """The shards of tables ``a`` and ``b`` paired by name, or None when they do not pair."""
    fa, fb = run.shards.get(a) or [], run.shards.get(b) or []
    if [f.name for f in fa] != [f.name for f in fb]:
        return None
    pa, pb = run.parts(a), run.parts(b)
    return list(zip(pa, pb, strict=True))


def _chain_problem(drafts: pl.LazyFrame, steps: pl.LazyFrame, stepless: bool = False) -> str | None:
    """``stepless``: steps may verify what no drafts row holds, and a model draft's rows stop at its
    first rejection (a live HVD run: cache drafts are verified too)."""
    g = drafts.group_by("request", "step").agg(
        pl.len().alias("_n"), pl.col("position").n_unique().alias("_u"),
        (pl.col("label") == 1).sum().alias("_a"), (pl.col("label") == 0).sum().alias("_r"),
        pl.col("position").filter(pl.col("label") == 1).max().alias("_amax"),
        pl.col("position").filter(pl.col("label") == 0).min().alias("_rpos"))
    s = steps.select("request", "step", "drafted", "accepted", "kept")
    j = g.join(s, on=["request", "step"], how="full", coalesce=True)
    a, kept = pl.col("accepted").cast(pl.Int64), pl.col("kept").cast(pl.Int64)
    checks = [
        (pl.col("drafted").is_null(), "drafts of a step the steps table does not hold"),
        (pl.col("_n").is_null() & (pl.col("kept") > 0) & pl.lit(not stepless), "a step with `kept` > 0 but no drafts"),
        # svt's engine logs every draft (trimmed ones unlabelled); vLLM's spool only the verified ones
        # (a live HVD run logs a model draft's rows up to its first rejection only)
        (((pl.col("_n") < kept) & pl.lit(not stepless)) | (pl.col("_n") > pl.col("drafted").cast(pl.Int64)),
         "a number of drafts outside [`kept`, `drafted`]"),
        (pl.col("_u") != pl.col("_n"), "two drafts at one position"),
        (pl.col("_a") != a, "a number of drafts labelled 1 other than the step's `accepted`"),
        ((pl.col("_a") > 0) & (pl.col("_amax") != pl.col("_a") - 1),
         "drafts labelled 1 that are not positions 0 .. accepted - 1"),
        (pl.col("_r") > 1, "more than one draft labelled 0 (verification stops at the first rejection)"),
        ((pl.col("_r") == 1) & (pl.col("_rpos") != a), "a rejected draft at a position other than `accepted`"),
        (pl.col("_r").cast(pl.Int64) != (a < kept).cast(pl.Int64),
         "a rejected draft missing (accepted < kept) or present (accepted = kept)"),
    ]
    return _first(j, checks)


def _tree_problem(nodes: pl.LazyFrame, steps: pl.LazyFrame, greedy: bool) -> str | None:
    if greedy:
        bad = nodes.filter(pl.col("label").is_not_null() & (pl.col("label") != pl.col("match")))
        row = bad.select("request", "step", "node", "label", "match").head(1).collect()
        if row.height:
            r = row.row(0, named=True)
            return (f"request {r['request']} step {r['step']}: node {r['node']} is labelled {r['label']} but its "
                    f"`match` is {r['match']}; under greedy verification a verified node is accepted exactly when "
                    "it is the target's argmax")
    g = nodes.group_by("request", "step").agg(pl.len().alias("_n"), (pl.col("label") == 1).sum().alias("_a"))
    j = g.join(steps.select("request", "step", "drafted", "accepted"), on=["request", "step"], how="full",
               coalesce=True)
    return _first(j, [
        (pl.col("drafted").is_null(), "tree nodes of a step the steps table does not hold"),
        (pl.col("_n").is_null() & (pl.col("drafted") > 0), "a step with `drafted` > 0 but no tree nodes"),
        (pl.col("_n") != pl.col("drafted").cast(pl.Int64), "a number of tree nodes other than the step's `drafted`"),
        (pl.col("_a") != pl.col("accepted").cast(pl.Int64),
         "an accepted path (nodes labelled 1) whose length is not the step's `accepted`"),
    ])


def _first(j: pl.LazyFrame, checks: list[tuple[pl.Expr, str]]) -> str | None:
    counts = j.select([c.fill_null(False).sum().alias(str(i)) for i, (c, _) in enumerate(checks)]).collect().row(0)
    for n, (cond, what) in zip(counts, checks, strict=True):
        if n:
            r = j.filter(cond.fill_null(False)).select("request", "step").head(1).collect().row(0)
            return f"{n} step(s) with {what} (first: request {r[0]} step {r[1]})"
    return None


def _acceptance_problem(drafts: pl.LazyFrame, greedy: bool | None) -> str | None:
    """A draft's acceptance probability against its label and, where run.json says how the run
    verified, against the rule that defines it: min(1, p_sampled / q_sampled) under sampling, 1
    exactly when the label is 1 under greedy verification."""
    ap = pl.col("accept_prob")
    checks = [((pl.col("label") == 1) & (ap == 0), "a draft accepted with an acceptance probability of 0")]
    if greedy:
        checks.append((pl.col("label").is_not_null() & (ap != pl.col("label").cast(pl.Float32)),
                       "under greedy verification an `accept_prob` other than its label (1: the target's argmax)"))
    elif greedy is False:
        rule = pl.min_horizontal(pl.lit(1.0), pl.col("p_sampled") / pl.col("q_sampled"))
        checks.append(((ap - rule).abs() > 1e-5 + 1e-5 * rule, "an `accept_prob` other than min(1, p_sampled / "
                                                                 "q_sampled), the speculative sampling rule"))
    counts = drafts.select([c.fill_null(False).sum().alias(str(i)) for i, (c, _) in enumerate(checks)]).collect().row(0)
    for n, (cond, what) in zip(counts, checks, strict=True):
        if n:
            r = drafts.filter(cond.fill_null(False)).select("request", "step", "position").head(1).collect().row(0)
            return f"{n} draft(s) with {what} (first: request {r[0]} step {r[1]} position {r[2]})"
    return None


def _path_problem(nodes: pl.LazyFrame) -> str | None:
    """A tree node's ``path_prob`` is its parent's times its own ``q_token`` (``q_token`` at depth 0)."""
    parents = nodes.select("request", "step", pl.col("node").alias("parent"), pl.col("path_prob").alias("_pp"))
    j = nodes.join(parents, on=["request", "step", "parent"], how="left").with_columns(
        pl.when(pl.col("parent") < 0).then(pl.col("q_token").cast(pl.Float64))
        .otherwise(pl.col("_pp").cast(pl.Float64) * pl.col("q_token").cast(pl.Float64)).alias("_want"))
    bad = j.filter((pl.col("path_prob").cast(pl.Float64) - pl.col("_want")).abs() > 1e-5 * pl.col("_want") + 1e-7)
    row = bad.select(pl.len(), pl.col("request").first(), pl.col("step").first(), pl.col("node").first()).collect().row(0)
    if row[0]:
        return (f"{row[0]} tree node(s) whose `path_prob` is not their parent's times their `q_token` (first: request "
                f"{row[1]} step {row[2]} node {row[3]})")
    return None


def _workload_problem(run) -> str | None:
    """A request's workload is one in the requests table and in its drafts."""
    table = "tree_drafts" if run.has("tree_drafts") else "drafts"
    if not run.has(table) or not run.has("requests"):
        return None
    return _workload_of(run.scan(table), run.scan("requests"), table)


def _workload_of(drafts: pl.LazyFrame, requests: pl.LazyFrame, table: str) -> str | None:
    d = drafts.select("request", "workload").unique()
    r = requests.select("request", pl.col("workload").alias("_rw"))
    bad = d.join(r, on="request", how="left").filter(pl.col("_rw").is_null() | (pl.col("_rw") != pl.col("workload")))
    row = bad.select(pl.len(), pl.col("request").first(), pl.col("workload").first(), pl.col("_rw").first()).collect().row(0)
    if row[0]:
        if row[3] is None:
            return (f"the {table} and requests tables disagree: request {row[1]} has {table} rows but no row in the "
                    f"requests table ({row[0]} such (request, workload) pairs)")
        return (f"the {table} and requests tables disagree: request {row[1]} is workload {row[2]!r} in {table} and "
                f"{row[3]!r} in requests ({row[0]} such (request, workload) pairs)")
    return None


def check_derived(run) -> None:
    """The cross-table checks of an opened run (see the module docstring); one SchemaError naming
    the run, the check and the first step that fails it."""
    meta = run.meta
    said = (meta.get("sampling") or {}).get("greedy")
    greedy = said if isinstance(said, bool) else None  # a run that does not say is held to the label check only
    lacks = set(run.lacks("drafts")) if run.has("drafts") else set()
    # a synthetic run's requests are steps drawn from many source requests: their drafts keep their own workloads
    found = None if meta.get("synthetic") else _workload_problem(run)
    if not found and run.has("drafts") and not lacks & {"accept_prob", "p_sampled", "q_sampled", "label"}:
        found = _acceptance_problem(run.scan("drafts"), greedy)
    if not found and run.has("tree_drafts"):
        found = _path_problem(run.scan("tree_drafts"))
    if found:
        raise SchemaError(f"{Path(run.path)}: {found}.")
    _check_pairs(run, meta, greedy)
    found = None
    if run.has("steps"):  # after the drafts and steps agree step by step: the steps as a whole
        found = steps_problem(meta, run.scan("steps"), run.scan("requests") if run.has("requests") else None)
    if not found and run.has("schedule"):
        found = schedule_problem(meta, run.scan("schedule"))
    if found:
        raise SchemaError(f"{Path(run.path)}: {found}.")
    check_run_whole(run)


def check_run_whole(run) -> None:
    """:func:`svt.traces.whole.run_problem` as an error naming the run (one machine and cluster)."""
    found = run_problem(run)
    if found:
        raise SchemaError(f"{Path(run.path)}: {found}.")


def _check_pairs(run, meta: dict, greedy: bool | None) -> None:
    """The drafts (or tree nodes) of each step against its steps row."""
    if not run.has("steps"):
        return
    if isinstance(meta.get("tree"), dict):
        if not run.has("tree_drafts"):
            return

        def problem(a, b):
            return _tree_problem(a, b, bool(greedy))
        table = "tree_drafts"
    else:
        if not run.has("drafts") or "label" in run.lacks("drafts"):
            return
        stepless = bool(meta.get("hvd"))  # live HVD verifies cache drafts too: steps without model drafts

        def problem(a, b):
            return _chain_problem(a, b, stepless)
        table = "drafts"
    found = None
    pairs = _paired(run, table, "steps")
    if pairs is not None:
        found = next((p for p in (problem(a, b) for a, b in pairs) if p), None)
    if pairs is None or found:  # a step split over shards reads whole before it is called wrong
        found = problem(run.scan(table), run.scan("steps"))
    if found:
        raise SchemaError(f"{Path(run.path)}: the {table} and steps tables disagree: {found}.")


def part_problem(meta: dict, lacks: set, parts: dict[str, pl.LazyFrame], requests: pl.LazyFrame | None) -> str | None:
    """:func:`check_derived`'s checks on one shard of each table (``parts``: the shards of one name,
    as every svt writer pairs them; ``requests``: the whole requests table, or None when the run has
    none), for a cluster that checks a run shard by shard. The caller checks that the tables pair by
    name (else :func:`check_derived` reads them whole). The problem found, in
    :func:`check_derived`'s words, or None."""
    said = (meta.get("sampling") or {}).get("greedy")
    greedy = said if isinstance(said, bool) else None
    table = "tree_drafts" if isinstance(meta.get("tree"), dict) or "tree_drafts" in parts else "drafts"
    found = None
    if not meta.get("synthetic") and requests is not None and table in parts:
        found = _workload_of(parts[table], requests, table)
    if not found and "drafts" in parts and not lacks & {"accept_prob", "p_sampled", "q_sampled", "label"}:
        found = _acceptance_problem(parts["drafts"], greedy)
    if not found and "tree_drafts" in parts:
        found = _path_problem(parts["tree_drafts"])
    if found:
        return found
    if "steps" in parts and table in parts and not (table == "drafts" and "label" in lacks):
        if table == "tree_drafts":
            found = _tree_problem(parts[table], parts["steps"], bool(greedy))
        else:
            found = _chain_problem(parts["drafts"], parts["steps"], bool(meta.get("hvd")))
        if found:
            return f"the {table} and steps tables disagree: {found}"
    if "steps" in parts:
        found = steps_problem(meta, parts["steps"], requests)
    if not found and "schedule" in parts:
        found = schedule_problem(meta, parts["schedule"])
    return found
