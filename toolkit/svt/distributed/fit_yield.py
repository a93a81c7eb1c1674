"""``svt fit RUN --model yield-linear --cluster ...``: the linear yield predictor (scikit-learn's
``Ridge`` on standardised cache features, alpha 1e-3) fitted from summed statistics, recorded as the
single machine records it.

Passes over the cache_drafts shards, each on the workers:

1. each shard's requests, those that have a draft and its largest draft: the driver checks that no
   request spans two shards and that the shards together cover the requests, and makes the single
   machine's request-level split of the requests with a draft;
2. each shard checked row by row against the requests' outputs (as
   :func:`svt.fit.yield_data.check_cache_drafts` checks the whole table); for the training rows:
   the count and the sums of the features and of the yield;
3. the sums of the centred cross-products (features with features, features with the yield),
   around the means of pass 2: two passes, so no large mean cancels the spread.

The driver then solves Ridge's normal equations on the standardised features exactly as scikit-learn
does (standard deviations with ``ddof = 0`` plus 1e-9, the intercept fitted by centring).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from svt.errors import ConfigError, DataError

ALPHA = 1e-3  # svt.fit.yield_models.YieldLinear's


def _rows(item: tuple, check: bool = False):
    from svt.fit.yield_data import check_cache_drafts
    from svt.traces.io import open_run, scan_shard

    path, run_path = item
    frame = scan_shard(path, "cache_drafts").collect()
    if check:
        check_cache_drafts(run_path, open_run(run_path, deep=False, tables=["requests", "cache_drafts"]), frame,
                           whole=False)
    return frame


def shard_keys(item: tuple) -> dict:
    """Pass 1 on a worker (see the module)."""
    frame = _rows(item)
    with_draft = frame.filter(pl.col("draft_len") > 0)
    return {"seen": np.unique(frame["request"].to_numpy()), "requests": np.unique(with_draft["request"].to_numpy()),
            "k": int(with_draft["draft_len"].max() or 0) if with_draft.height else 0}


def _xy(item: tuple, features: list[str], train: np.ndarray, check: bool = False):
    from svt.fit.yield_models import yield_matrix

    rows = _rows(item, check).filter((pl.col("draft_len") > 0) & pl.col("request").is_in(pl.Series(train).implode()))
    return yield_matrix(rows, features), rows["oracle_accepted"].to_numpy().astype(np.float64), rows["request"]


def shard_sums(item: tuple, features: list[str], train: np.ndarray) -> dict:
    """Pass 2 on a worker: count, feature sums, yield sum and the training requests present."""
    X, y, requests = _xy(item, features, train, check=True)
    return {"n": y.size, "sx": X.sum(0), "sy": float(y.sum()), "requests": np.unique(requests.to_numpy())}


def shard_cross(item: tuple, features: list[str], train: np.ndarray, mx: np.ndarray, my: float) -> dict:
    """Pass 3 on a worker: centred cross-products."""
    X, y, _ = _xy(item, features, train)
    Xc, yc = X - mx, y - my
    return {"sxx": Xc.T @ Xc, "sxy": Xc.T @ yc}


def ridge_from_sums(n: int, mx: np.ndarray, my: float, sxx: np.ndarray, sxy: np.ndarray,
                    alpha: float = ALPHA) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(mean, std, coef, intercept) of ``Ridge(alpha)`` fitted on ``(X - mean) / std`` from the
    centred sums: the standardised features have zero mean, so the intercept is the mean yield."""
    std = np.sqrt(np.maximum(np.diag(sxx) / n, 0.0)) + 1e-9
    gram = sxx / np.outer(std, std)
    coef = np.linalg.solve(gram + alpha * np.eye(mx.size), sxy / std)
    return mx, std, coef, float(my)


def cluster_yield_training(engine):
    """The training step :func:`svt.fit.fit_prepared` takes for yield-linear, run on ``engine``."""

    def train(runs, est, test_fraction: float, seed: int, where):
        from svt.distributed.reading import read_run
        from svt.features.cache import get_cache_features
        from svt.fit import Trained
        from svt.fit.yield_data import check_cache_coverage
        from svt.fit.yield_models import YieldLinear
        from svt.traces.identity import run_record

        if type(est) is not YieldLinear or len(runs) != 1 or where is not None:
            raise ConfigError("--cluster fits yield-linear on one run's cache drafts: fit the others on one machine.")
        get_cache_features(est.features)  # an unknown feature is refused before the run is read
        run, identity = read_run(runs[0], engine, "cache_drafts")  # the identity of the rows it reads
        run.require_complete()
        if not run.has("cache_drafts"):
            raise DataError(f"{runs[0]}: no `cache_drafts` table; collect a greedy run with `cache: true` "
                            "or add it with `svt cache RUN`.")
        items = [(str(f), str(runs[0])) for f in run.shards["cache_drafts"]]
        keys = engine.map(shard_keys, items)
        seen = np.concatenate([p["seen"] for p in keys])
        if np.unique(seen).size != seen.size:
            raise DataError(f"{runs[0]}: a request's cache drafts span two shards; --cluster needs each request in "
                            "one shard (as the collector writes them): fit it on one machine.")
        check_cache_coverage(runs[0], run, set(seen.tolist()))
        requests = np.concatenate([p["requests"] for p in keys])
        if requests.size == 0:
            raise DataError("No cache drafts to fit on: the cache proposed nothing.")
        requests = np.sort(requests)  # as split_mask: a seeded permutation of the sorted requests
        test = np.zeros(requests.size, dtype=bool)
        test[np.random.default_rng(seed).permutation(requests.size)[:int(round(test_fraction * requests.size))]] = True
        train_ids = requests[~test]
        sums = engine.map(shard_sums, items, est.features, train_ids)
        n = sum(s["n"] for s in sums)
        if n == 0:
            raise DataError("No cache-draft rows in the training requests.")
        mx, my = sum(s["sx"] for s in sums) / n, sum(s["sy"] for s in sums) / n
        cross = engine.map(shard_cross, items, est.features, train_ids, mx, my)
        est.mean_, est.std_, est.coef_, est.intercept_ = ridge_from_sums(
            n, mx, my, sum(c["sxx"] for c in cross), sum(c["sxy"] for c in cross))
        trained = np.concatenate([s["requests"] for s in sums])
        frame = pl.DataFrame({"_run": np.zeros(trained.size, dtype=np.int64), "request": trained.astype(np.int64)})
        return Trained([{**run_record(runs[0], run), "data": identity}], max(p["k"] for p in keys), n,
                       {"mean_yield": my}, frame)

    return train
