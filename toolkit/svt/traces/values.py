"""The bounds each table's values must respect, as polars expressions counted in one pass.

Every check is an expression that counts a shard's offending rows, aliased ``kind:column``; the kind
names the message (``BAD_VALUE``). Adding a table's bounds adds one function to ``TABLE_CHECKS``."""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from svt.traces.schema import TableSchema

BAD_VALUE = {
    "null": "null, which this column does not allow",
    "prob": "NaN or outside [0, 1]",
    "label": "a label other than 0, 1 or null",
    "nonneg": "NaN, infinite or negative",
    "len": "a value other than the length of `draft_ids`",
    "yield": "a value outside [0, draft_len]",
    "tree": "a parent that is not an earlier node of its tree",
    "nodes": "nodes not numbered 0, 1, ... within their tree (a row missing or repeated)",
    "depth": "a depth other than its parent's + 1",
    "path": "labels that are not one accepted path (two accepted siblings, or a label below a node "
            "that was not accepted)",
    "lack": "values, but run.json says the run's source lacks this column",
    "sched": "a value no engine step has (a batch below 1 row, fewer verified positions than rows, a "
             "negative count)",
    "pnull": "nulls on verified drafts (null is for drafts live AV trimmed before the target saw them)",
    "token": "a negative token id (a vocabulary's ids start at 0)",
}

Checks = list[pl.Expr]


def _negative(cols: tuple[str, ...]) -> Checks:
    return [(pl.col(c) < 0).sum().alias(f"nonneg:{c}") for c in cols]


def _not_finite_or_negative(cols: tuple[str, ...], kind: str = "nonneg") -> Checks:
    return [(~pl.col(c).is_finite() | (pl.col(c) < 0)).sum().alias(f"{kind}:{c}") for c in cols]


def _tokens(cols: tuple[str, ...], names: list[str], lacks: frozenset[str]) -> Checks:
    """Token ids (a column of ids, or of lists of ids) that are negative."""
    out = []
    for c in cols:
        if c in names and c not in lacks:
            ids = pl.col(c).list.min() if c.endswith("_ids") else pl.col(c)
            out.append((ids < 0).sum().alias(f"token:{c}"))
    return out


def _labels(cols: tuple[str, ...]) -> Checks:
    return [(~pl.col(c).is_in([0, 1])).sum().alias(f"label:{c}") for c in cols]


def common_checks(spec: TableSchema, names: list[str], lacks: frozenset[str]) -> Checks:
    """Nulls where the schema allows none, columns the run's source lacks holding values, and
    probabilities that are NaN or outside [0, 1]."""
    checks = []
    for col in spec.columns:
        if col in lacks:
            checks.append(pl.col(col).is_not_null().sum().alias(f"lack:{col}"))
        elif col not in spec.nullable:
            checks.append(pl.col(col).null_count().alias(f"null:{col}"))
    for col in spec.probabilities:
        if col in spec.optional and col not in names:
            continue
        bad = pl.col(col).is_nan() | (pl.col(col) < 0) | (pl.col(col) > 1)
        checks.append(bad.sum().alias(f"prob:{col}"))
    return checks


def _drafts(names: list[str], lacks: frozenset[str]) -> Checks:
    checks = (_labels(("label",)) + _negative(("position",)) + _not_finite_or_negative(("q_entropy",))
              + _tokens(("token",), names, lacks))
    for col in ("p_sampled", "p_max", "accept_prob", "accept_prob_expected"):  # null: trimmed before verifying
        if col not in lacks:
            checks.append((pl.col(col).is_null() & pl.col("label").is_not_null()).sum().alias(f"pnull:{col}"))
    return checks


def _cache_trees(names: list[str], lacks: frozenset[str]) -> Checks:
    return (_labels(("label",)) + _negative(("depth", "node", "decode_pos", "match_len"))
            + [(pl.col("node") <= pl.col("parent")).sum().alias("tree:parent")]
            + _not_finite_or_negative(("score", "lookup_ms")) + _tokens(("token",), names, lacks))


def _tree_drafts(names: list[str], lacks: frozenset[str]) -> Checks:
    return (_labels(("label", "match")) + _negative(("depth", "rank", "node"))
            + [(pl.col("parent") >= pl.col("node")).sum().alias("tree:parent"),
               *_not_finite_or_negative(("q_entropy",)), *_tokens(("token",), names, lacks)])


def _schedule(names: list[str], lacks: frozenset[str]) -> Checks:
    checks = _not_finite_or_negative(("prefill_ms", "draft_ms", "verify_ms", "step_ms"))
    checks.append((pl.col("batch_size") < 1).sum().alias("sched:batch_size"))
    checks.append((pl.col("verify_tokens") < pl.col("batch_size")).sum().alias("sched:verify_tokens"))
    checks += [(pl.col(c) < 0).sum().alias(f"sched:{c}") for c in ("admitted", "draft_passes", "emitted")]
    if "forward_ms" in names:  # the time inside a step's forwards: within the step
        checks.append((~pl.col("forward_ms").is_finite() | (pl.col("forward_ms") < 0)
                       | (pl.col("forward_ms") > pl.col("step_ms"))).sum().alias("sched:forward_ms"))
    if "verify_slots" in names:  # the cache a row attended holds at least the positions it verified
        checks.append((pl.col("verify_slots") * pl.col("batch_size") < pl.col("verify_tokens"))
                      .sum().alias("sched:verify_slots"))
    return checks


def _cache_drafts(names: list[str], lacks: frozenset[str]) -> Checks:
    checks = [(pl.col("draft_len") != pl.col("draft_ids").list.len()).sum().alias("len:draft_len"),
              ((pl.col("oracle_accepted") < 0) | (pl.col("oracle_accepted") > pl.col("draft_len")))
              .sum().alias("yield:oracle_accepted")]
    checks += _negative(("model_accepted", "match_len", "decode_pos", "context_len", "prev_draft_len",
                         "prev_match_len"))
    return (checks + _not_finite_or_negative(("score", "lookup_ms", "hist_yield_mean", "hist_yield_max"))
            + _tokens(("draft_ids",), names, lacks))


def _requests(names: list[str], lacks: frozenset[str]) -> Checks:
    return _tokens(("prompt_ids", "output_ids"), names, lacks)


def _dists(names: list[str], lacks: frozenset[str]) -> Checks:
    return _tokens(("token", "q_top_ids", "p_top_ids"), names, lacks)


def _steps(names: list[str], lacks: frozenset[str]) -> Checks:
    checks = _not_finite_or_negative(tuple(c for c in ("draft_ms", "verify_ms") if c in names and c not in lacks))
    if "batch_size" in names and "batch_size" not in lacks:
        checks.append((pl.col("batch_size") < 1).sum().alias("sched:batch_size"))
    return checks


TABLE_CHECKS: dict[str, Callable[[list[str], frozenset[str]], Checks]] = {
    "drafts": _drafts, "steps": _steps, "cache_trees": _cache_trees, "tree_drafts": _tree_drafts, "schedule": _schedule,
    "cache_drafts": _cache_drafts, "requests": _requests, "dists": _dists,
}


def table_checks(table: str, names: list[str], lacks: frozenset[str]) -> Checks:
    """The table's own bounds (none for a table without an entry)."""
    fn = TABLE_CHECKS.get(table)
    return fn(names, lacks) if fn else []


def tree_structure(lf: pl.LazyFrame, key: tuple[str, ...] = ("request", "step")) -> dict[str, int]:
    """Counts of the tree rows (``tree_drafts``, or ``cache_trees`` keyed by decode position) that
    break the tree's structure, by check: nodes numbered 0, 1, ... in each tree, depth = the
    parent's + 1, and the labels one path from the root (a node is tried only under an accepted
    parent, and at most one child of a node is accepted)."""
    step = list(key)
    f = lf.select(*step, "node", "parent", "depth", "label").collect()
    par = f.select(*step, pl.col("node").alias("parent"), pl.col("depth").alias("_pd"),
                   pl.col("label").alias("_pl"))
    j = f.join(par, on=[*step, "parent"], how="left")
    kid = j.filter(pl.col("parent") >= 0)
    accepted_siblings = f.filter(pl.col("label") == 1).group_by(*step, "parent").len().filter(pl.col("len") > 1)
    return {"nodes:node": f.select((pl.col("node") != pl.int_range(pl.len()).over(step, order_by="node")).sum()).item(),
            "depth:depth": kid.select((pl.col("_pd").is_null() | (pl.col("depth") != pl.col("_pd") + 1)).sum()).item()
            + f.select(((pl.col("parent") < 0) & (pl.col("depth") != 0)).sum()).item(),
            "path:label": kid.select((pl.col("label").is_not_null() & (pl.col("_pl") != 1).fill_null(True)).sum()).item()
            + accepted_siblings.height}
