"""``svt fit RUN --model logistic --cluster ...``: the offline logistic fit of one run on a cluster,
recorded as the single-machine fit records it (the same fit file, usable by ``svt evaluate``);
:func:`fit_on_cluster` also fits yield-linear (:mod:`svt.distributed.fit_yield`).

The driver never holds the drafts. Passes over the shards, each on the workers:

1. the requests in each shard and the largest position: the driver makes the same request-level
   split as :func:`svt.fit.held_out.split_mask` (a seeded permutation of the sorted requests) and
   checks that no request spans two shards;
2. for the training requests: labelled rows, positives, the requests with labelled drafts, and
   their acceptance signatures (:func:`svt.traces.identity.request_signatures`, per request, so
   per shard);
3. distributed Newton (:mod:`svt.distributed.fit`).

The training record (requests, signatures, token signatures from the requests table, the run's
identity) is then written by :func:`svt.fit.fit_prepared`, as for a fit on one machine.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from svt.errors import ConfigError, DataError


def _scan(path: str, columns: dict) -> pl.LazyFrame:
    return pl.scan_parquet(path).with_columns([pl.col(c).cast(t) for c, t in columns.items()])


def shard_requests(path: str, columns: dict) -> tuple[np.ndarray, int]:
    d = _scan(path, columns).select(pl.col("request").unique().alias("r"), pl.col("position").max().alias("m")).collect()
    return np.sort(d["r"].drop_nulls().to_numpy()), int(d["m"].max() if d.height else -1)


def shard_training(path: str, columns: dict, train: np.ndarray) -> dict:
    from svt.traces.identity import request_signatures

    lf = _scan(path, columns).filter(pl.col("request").is_in(pl.Series(train).implode()))
    lab = lf.filter(pl.col("label").is_not_null()).select("request", "label").collect()
    sig = request_signatures(lf)
    return {"rows": lab.height, "positives": int(lab["label"].sum() or 0),
            "requests": np.unique(lab["request"].to_numpy()), "signatures": sig["signature"].to_list()}


def cluster_training(engine):
    """The training step :func:`svt.fit.fit_prepared` takes, run on ``engine`` (see the module)."""

    def train(runs, est, test_fraction: float, seed: int, where):
        from svt.distributed.fit import fit_logistic
        from svt.distributed.reading import read_run
        from svt.features import get_feature
        from svt.fit import Trained
        from svt.fit.logistic import LogisticFitter
        from svt.traces.identity import run_record
        from svt.traces.schema import get_table

        if not isinstance(est, LogisticFitter) or len(runs) != 1 or where is not None:
            raise ConfigError("--cluster fits the logistic model on one run: fit the others on one machine.")
        run, identity = read_run(runs[0], engine, "drafts")  # deeply, on the workers
        run.require_complete()
        if run.censored:
            raise ConfigError(f"{runs[0]} was collected with live AV (censored labels): fit it on one machine.")
        columns = dict(get_table("drafts").columns)
        shards = [str(p) for p in run.shards["drafts"]]
        parts = engine.map(shard_requests, shards, columns)
        keys = np.concatenate([p[0] for p in parts])
        if np.unique(keys).size != keys.size:
            raise DataError(f"{runs[0]}: a request's drafts span two shards; --cluster needs each request in one "
                            "shard (as the collector writes them): fit it on one machine.")
        keys = np.sort(keys)  # as split_mask: a seeded permutation of the sorted requests
        n_test = int(round(test_fraction * keys.size))
        test = np.zeros(keys.size, dtype=bool)
        test[np.random.default_rng(seed).permutation(keys.size)[:n_test]] = True
        train_ids = keys[~test]
        k = max(p[1] for p in parts) + 1
        got = engine.map(shard_training, shards, columns, train_ids)
        rows, positives = sum(g["rows"] for g in got), sum(g["positives"] for g in got)
        if rows == 0:
            from svt.fit import no_drafts

            raise no_drafts(runs)
        if positives in (0, rows):
            raise DataError(f"Only one class among the {rows} labelled drafts: a predictor cannot be fitted.")
        feats = [(name, get_feature(name).expr) for name in est.features]
        beta, est.iterations_ = fit_logistic(engine, shards, columns, feats, k, train_ids,
                                             per_position_slope=est.per_position_slope)
        m = len(feats)
        est.slope_ = beta[: m * k].reshape(m, k) if est.per_position_slope else beta[:m]
        est.intercepts_ = beta[-k:]
        trained = np.concatenate([g["requests"] for g in got])
        requests = pl.DataFrame({"_run": np.zeros(trained.size, dtype=np.int32), "request": trained})
        return Trained([{**run_record(runs[0], run), "data": identity}], k, rows, {"accept_rate": positives / rows},
                       requests.with_columns(pl.col("request").cast(pl.Int64)),
                       sorted(s for g in got for s in g["signatures"]))

    return train


def fit_on_cluster(runs: list[str | Path], model: str, cluster: str, engine: str = "dask", **options):
    """``fit_runs`` on a cluster (the logistic model, see the module; yield-linear, see
    :mod:`svt.distributed.fit_yield`)."""
    from svt.distributed.engines import start
    from svt.distributed.fit_yield import cluster_yield_training
    from svt.fit import fit_prepared, prepare_fit

    steps = {"logistic": cluster_training, "yield-linear": cluster_yield_training}
    if model not in steps:
        raise ConfigError(f"--cluster fits {' and '.join(steps)} (by summed statistics); {model!r} runs on one "
                          "machine (without --cluster).")
    cls, est, test_fraction, seed = prepare_fit(model, **options)
    with start(cluster, engine) as eng:
        return fit_prepared(runs, cls, est, test_fraction, seed, None, training=steps[model](eng))
