"""Fitted predictors (``svt evaluate RUN --fit FIT --cluster ...``) scored on a cluster, on the rows
one machine would score them on.

Which requests a fit may be scored on (its held-out requests on its own training run; on a run it
never saw, every request shown not to repeat a training request) is decided per request, so the
driver decides it from one row a request, never from the drafts: the workers list each shard's
requests with their acceptance signatures (:func:`svt.traces.identity.request_signatures`, per
request, so per shard: a request in two shards is refused), and the driver runs
:func:`svt.fit.evaluation_mask` on those rows, with the single machine's refusals, notes and
``--score-unverified``. Each worker then predicts on its shard's drafts with the fit the driver
loaded (the same object, not the file read again), keeps the scored requests' rows and summarises
the predictions like any probability score.

Fits whose prediction reads a drafts row alone are scored (``Fitter.row_wise``: logistic, sts,
platt, isotonic); the online estimator replays the drafts in decode order (prequential), a head reads
hidden states and yield and tree fits score other tables: each is refused by name, to be evaluated
on one machine.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from svt.errors import ConfigError, DataError


def shard_request_rows(item: tuple) -> pl.DataFrame:
    """On a worker: one row per request of a drafts shard (``item``: its path and its run's index),
    with its acceptance signature (null: too few verified steps to sign)."""
    path, run_index = item[0], item[1]
    from svt.traces.identity import request_signatures
    from svt.traces.io import scan_shard

    d = scan_shard(path, "drafts").select("request", "step", "label").collect()
    keys = d.select(pl.col("request").cast(pl.Int64)).unique().sort("request")
    sig = request_signatures(d).select(pl.col("request").cast(pl.Int64), pl.col("signature").alias("_signature"))
    return keys.join(sig, on="request", how="left").with_columns(pl.lit(run_index, pl.Int64).alias("_run"))


def _refusal(fit, path) -> str | None:
    if fit.online:
        return f"{path} ({fit.name}: the online estimator is scored prequentially, replaying the drafts in order)"
    if fit.table != "drafts" or fit.target != "acceptance":
        return f"{path} ({fit.name}: it scores the {fit.table} table)"
    if not fit.row_wise:
        return f"{path} ({fit.name}: its prediction reads more than a drafts row, e.g. hidden states)"
    return None


def load_fits(fits: list[str]) -> list:
    """The fits loaded, each checked to be scored row by row (see the module): before any shard is
    read."""
    from svt.fit import Fitter

    loaded = [Fitter.load(p) for p in fits]
    refused = [r for f, p in zip(loaded, fits, strict=True) if (r := _refusal(f, p))]
    if refused:
        raise ConfigError(f"--cluster scores fits that predict each draft from its own row; not {'; '.join(refused)}. "
                          "Evaluate those on one machine (without --cluster).")
    return loaded


def plan_fits(run_paths: list[Path], runs: list, fits: list[str], loaded: list, engine, items: list[tuple],
              score_unverified: bool = False) -> list[dict]:
    """On the driver: each fit (``loaded`` by :func:`load_fits`) named as the single machine names
    it, with the requests it is scored on (see the module)."""
    from svt.fit import evaluation_mask, name_fits, scoring_unverified

    per_request = pl.concat(engine.map(shard_request_rows, items))
    split = per_request.filter(pl.struct("_run", "request").is_duplicated())
    if split.height:
        raise DataError(f"{run_paths[split['_run'][0]]}: request {split['request'][0]}'s drafts span two shards; "
                        "--cluster --fit needs each request in one shard (as the collector writes them): evaluate "
                        "the fit on one machine.")
    labels = name_fits(fits, [f.label() for f in loaded])
    plans = []
    for path, fit, label in zip(fits, loaded, labels, strict=True):
        notes: list[str] = []
        with scoring_unverified(score_unverified):
            ok = evaluation_mask(fit, per_request, [r.meta.get("run_id") for r in runs], list(run_paths), notes)
        how = (fit.training_ or {}).get("evaluation", "") + "".join(f"; {n}" for n in notes)
        scored = per_request.filter(pl.Series(ok))
        plans.append({"name": label, "path": str(path), "fit": fit, "runs": [str(r) for r in run_paths],
                      "scored": {i: np.sort(scored.filter(pl.col("_run") == i)["request"].to_numpy())
                                 for i in range(len(runs))},
                      "description": f"fitted predictor {Path(path).name} ({how})"})
    return plans


def fit_columns(frame: pl.DataFrame, plans: list[dict], run_index: int) -> pl.DataFrame:
    """On a worker: ``frame`` (a drafts shard of run ``run_index``, every row) with a column ``_fitI`` of each fit's
    predictions on the rows it is scored on (null elsewhere); a prediction that is no probability
    there is an error, as on one machine."""
    from svt.fit import PredictContext
    from svt.report.scoring import check_fit_predictions

    replay = frame.with_columns(pl.lit(run_index, pl.Int64).alias("_run"))
    cols = []
    for i, plan in enumerate(plans):
        pred = np.asarray(plan["fit"].predict(replay, PredictContext(runs=[Path(r) for r in plan["runs"]])),
                          dtype=np.float64)
        if pred.shape != (frame.height,):
            raise DataError(f"The fit {plan['path']} gave {pred.shape} predictions for {frame.height} drafts.")
        ok = np.isin(replay["request"].to_numpy(), plan["scored"][run_index])
        check_fit_predictions(plan["path"], replay, pred, ok)
        cols.append(pl.Series(f"_fit{i}", np.where(ok, pred, np.nan)).fill_nan(None))
    return frame.with_columns(cols)
