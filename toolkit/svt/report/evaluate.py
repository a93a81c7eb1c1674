"""`svt evaluate`: one report dict (written as report.json and report.md) from one or more runs,
built by the report's sections in turn (:mod:`svt.report.sections`)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl

from svt import __version__, features
from svt.errors import DataError
from svt.features import check_feature, get_feature, load_feature_module
from svt.report.schema import REPORT_SCHEMA
from svt.report.scoring import SOFT_LABELS, EvaluateOptions, add_fits, open_for_evaluation
from svt.report.sections import SECTIONS, ReportContext
from svt.traces.io import open_run


def evaluate(runs: list[str | Path], opts: EvaluateOptions | None = None) -> dict:
    """Build the evaluation report for one or more run directories.

    The feature table, acceptance and expected-length calibration read the runs shard by shard
    and column by column, so a run far larger than memory is evaluated (see
    :func:`svt.report.scoring.features_table`). Fits, the bootstrap, groups, the replay and the
    losslessness audit hold the drafts in memory.
    """
    opts = opts or EvaluateOptions()
    from svt.fit import scoring_unverified

    with scoring_unverified(opts.score_unverified):  # fits scored on requests svt cannot show were held out
        return _evaluate(runs, opts)


def _evaluate(runs: list[str | Path], opts: EvaluateOptions) -> dict:
    ctx = _context([Path(r) for r in runs], opts)
    if isinstance(ctx, dict):  # runs without model drafts: the cache-only report
        return ctx
    report: dict = {
        "report_schema": REPORT_SCHEMA,
        "svt_version": __version__,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "runs": ctx.infos,
        "settings": {"features": opts.features, "n_bins": opts.n_bins, "bootstrap": opts.bootstrap,
                     "seed": opts.seed, "by": opts.by, "labels": "hard labels (label not null)",
                     "soft_labels": list(SOFT_LABELS),
                     **({"score_unverified": True} if opts.score_unverified else {})},
    }
    for section in SECTIONS:
        report.update(section.compute(ctx, report))
    return report


def _context(runs: list[Path], opts: EvaluateOptions) -> ReportContext | dict:
    """Open and check the runs and the options; load the drafts when a section needs them in memory.
    Runs without model drafts (reference runs) give their cache-only report instead."""
    from svt.fit import split_fits
    from svt.report.reference import cache_only_report, check_reference_run

    if opts.feature_module:
        load_feature_module(opts.feature_module)
    feats = [get_feature(n) for n in opts.features]
    check_reference_run(opts.reference_run)  # before any work
    opened = open_for_evaluation(runs)
    metas = [open_run(r, deep=False, tables=["requests"]).meta for r in runs]
    if any(m.get("tree") for m in metas):
        from svt.report.trees import tree_report

        if not all(m.get("tree") for m in metas):
            raise DataError("A tree run cannot be evaluated beside chain runs: evaluate it alone.")
        return tree_report(runs, opts, opened.infos, metas)
    if all((m.get("counts") or {}).get("drafts") == 0 and "cache" in (m.get("drafter_kinds") or []) for m in metas):
        return cache_only_report(runs, opts, opened.infos, metas)
    if any(m.get("engine") == "reference" for m in metas):
        raise DataError("A reference run (no model drafts) cannot be evaluated beside runs with drafts: "
                        "evaluate it alone, or pass it with --reference-run.")
    head = opened.drafts.head(features.EARLY_CHECK_ROWS).collect()
    for f in feats:
        check_feature(f, head)
    # an imported trace may lack draft probabilities: the features that read them are not computed
    not_computed = {f.name: f"needs {', '.join(opened.missing(f))}, which the imported run lacks"
                    for f in feats if opened.missing(f)}
    feats = [f for f in feats if f.name not in not_computed]
    if opts.by is not None and opts.by not in head.columns:
        raise DataError(f"Cannot group by {opts.by!r}: the drafts table has no such column "
                        f"(columns: {', '.join(head.columns)}).")
    acc_fits, yield_fits = split_fits(opts.fits)
    in_memory = bool(acc_fits or opts.bootstrap or opts.by or len(runs) > 1 or opts.costs or opts.live
                     or opened.dists or opts.in_memory)
    ctx = ReportContext(runs, opts, opened, metas, feats, source=opened.drafts, in_memory=in_memory,
                        yield_fits=yield_fits, not_computed=not_computed)
    if in_memory:
        drafts = opened.drafts.collect().with_columns(pl.struct("run", "request").rank("dense").alias("_req"))
        drafts, fit_feats = add_fits(drafts, runs, opened.infos, acc_fits)
        ctx.drafts, ctx.feats = drafts, feats + fit_feats
        ctx.labelled = drafts.filter(pl.col("label").is_not_null())
        ctx.dists = pl.concat(opened.dists).collect() if opened.dists else None
        ctx.source = drafts.lazy()
    return ctx
