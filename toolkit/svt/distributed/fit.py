"""The offline logistic fit (:mod:`svt.fit.logistic`) as distributed Newton: each worker returns its
shard's gradient, Hessian and log-loss at the current coefficients (sums over its training rows,
so they add up across shards), the driver solves the Newton step and halves it while the summed
loss does not fall, exactly as :func:`svt.fit.logistic.fit_newton` does on one machine. A round is
one read of each shard; a fit takes a few rounds (each line-search trial is one more).

The training rows are the labelled drafts of the requests the driver names (``train``: the same
request-level split as on one machine, decided once and sent to every worker). The online
estimator replays drafts in order and stays on one machine.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from svt.fit.logistic import design, newton_step_stats


def _training_rows(path: str, columns: dict, features: list[tuple], train: np.ndarray):
    frame = (pl.scan_parquet(path).with_columns([pl.col(c).cast(t) for c, t in columns.items()])
             .filter(pl.col("label").is_not_null() & pl.col("request").is_in(pl.Series(train).implode()))
             .select("label", "position", *[e.cast(pl.Float64).alias(f"_f{i}") for i, (_, e) in enumerate(features)])
             .collect())
    x = np.column_stack([frame[f"_f{i}"].to_numpy() for i in range(len(features))])
    return x, frame["position"].to_numpy().astype(np.int64), frame["label"].to_numpy().astype(np.float64)


def shard_stats(path: str, columns: dict, features: list[tuple], k: int, per_position_slope: bool,
                train: np.ndarray, betas: list[np.ndarray]) -> list[tuple]:
    """For each coefficient vector in ``betas``: (gradient, Hessian, summed log-loss, rows) over this
    shard's training rows (one read of the shard for all of them)."""
    x, pos, y = _training_rows(path, columns, features, train)
    X = design(x, pos, k, per_position_slope=per_position_slope)
    return [(*newton_step_stats(X, y, b), y.size) for b in betas]


def _summed(parts: list[list[tuple]], i: int) -> tuple[np.ndarray, np.ndarray, float, int]:
    g = sum(p[i][0] for p in parts)
    H = sum(p[i][1] for p in parts)
    return g, H, float(sum(p[i][2] for p in parts)), int(sum(p[i][3] for p in parts))


def fit_logistic(engine, shards: list[str], columns: dict, features: list[tuple], k: int, train: np.ndarray, *,
                 per_position_slope: bool = False, tol: float = 1e-10, max_iter: int = 100) -> tuple[np.ndarray, int]:
    """Coefficients (slopes, then one intercept per position) and Newton iterations (see the module)."""
    m = len(features)
    beta = np.zeros(m * k + k if per_position_slope else m + k)
    train = np.unique(np.asarray(train, dtype=np.int64))

    def stats(betas):
        return engine.map(shard_stats, shards, columns, features, k, per_position_slope, train, betas)

    g, H, loss, n = _summed(stats([beta]), 0)
    if n == 0:
        from svt.errors import DataError

        raise DataError("No labelled draft of the training requests in these shards: nothing to fit.")
    for it in range(1, max_iter + 1):
        step = np.linalg.lstsq(H, -g, rcond=None)[0]
        decrement = float(-g @ step)
        t = 1.0
        while True:  # each trial is one round; an accepted one brings the next step's statistics
            cand = beta + t * step
            g_c, H_c, new_loss, _ = _summed(stats([cand]), 0)
            if new_loss <= loss + 1e-12 * abs(loss) or t < 1e-8:
                break
            t *= 0.5
        beta, loss, g, H = cand, new_loss, g_c, H_c
        if decrement / max(1.0, n) < tol:
            return beta, it
    return beta, max_iter
