"""Acceptance by draft position and expected-length calibration (the per-score metric tables and
their bootstrap intervals are :mod:`svt.metrics.ordered`'s)."""

from __future__ import annotations

import numpy as np
import polars as pl


def acceptance_by_position(drafts: pl.LazyFrame | pl.DataFrame) -> pl.DataFrame:
    """Acceptance by draft position in both conventions, with the exposure counts.

    ``conditional`` = accepted / verified at that position (verified = the chain reached it);
    ``marginal`` = accepted / proposed at that position (all drafts, labelled or not).
    """
    return (
        drafts.lazy()
        .group_by("position")
        .agg(
            pl.len().alias("proposed"),
            pl.col("label").is_not_null().sum().alias("verified"),
            (pl.col("label") == 1).sum().alias("accepted"),
        )
        .with_columns(
            (pl.col("accepted") / pl.col("verified")).alias("conditional"),
            (pl.col("accepted") / pl.col("proposed")).alias("marginal"),
        )
        .sort("position")
        .collect()
    )


def length_calibration(drafts: pl.LazyFrame | pl.DataFrame, confidence: str, *, n_bins: int = 10,
                       keys: tuple[str, ...] = ("request", "step")) -> dict:
    """Expected accepted length per step (sum over positions of the survival cumprod of the
    confidences) against the realised accepted run, binned by prediction on [0, K].

    This is the quantity Adaptive Verification's budget rule sums. Steps are those whose first
    draft was verified (every logged step).
    """
    per_step = (
        drafts.lazy()
        .sort([*keys, "position"])
        .group_by(list(keys), maintain_order=True)
        .agg(
            pl.col(confidence).cast(pl.Float64).cum_prod().sum().alias("predicted"),
            (pl.col("label") == 1).sum().cast(pl.Float64).alias("realised"),
            pl.len().alias("k"),
        )
        .collect()
    )
    return length_calibration_from_steps([per_step["predicted"].to_numpy()], [per_step["realised"].to_numpy()],
                                         int(per_step["k"].max()) if per_step.height else 0, n_bins)


def length_calibration_from_steps(predicted: list[np.ndarray], realised: list[np.ndarray], k: int,
                                  n_bins: int = 10) -> dict:
    """:func:`length_calibration` from per-step predicted and realised lengths given in parts
    (each part's steps whole), with ``k`` the longest step's draft count."""
    return length_calibration_from_sums(length_sums(predicted, realised, k, n_bins), k, n_bins)


def length_sums(predicted: list[np.ndarray], realised: list[np.ndarray], k: int, n_bins: int = 10) -> np.ndarray:
    """The sums :func:`length_calibration_from_sums` reads, which add across parts: per bin of the
    predicted length on [0, k], [steps, predicted sum, realised sum]."""
    out = np.zeros((n_bins, 3))
    for pred, real in zip(predicted, realised, strict=True):
        pred, real = pred.astype(np.float64), real.astype(np.float64)
        idx = np.minimum((pred / k * n_bins).astype(np.int64), n_bins - 1)
        out[:, 0] += np.bincount(idx, minlength=n_bins)
        out[:, 1] += np.bincount(idx, weights=pred, minlength=n_bins)
        out[:, 2] += np.bincount(idx, weights=real, minlength=n_bins)
    return out


def length_calibration_from_sums(sums: np.ndarray, k: int, n_bins: int = 10) -> dict:
    """:func:`length_calibration`'s result from :func:`length_sums` (added over parts)."""
    count, sp, sr = sums[:, 0].astype(np.int64), sums[:, 1], sums[:, 2]
    steps = int(count.sum())
    if steps == 0:
        return {"steps": 0, "bins": [], "mean_predicted": None, "mean_realised": None, "length_ece": None}
    bins = [
        {"lo": i * k / n_bins, "hi": (i + 1) * k / n_bins, "count": int(count[i]),
         "mean_predicted": float(sp[i] / count[i]), "mean_realised": float(sr[i] / count[i])}
        for i in range(n_bins) if count[i]
    ]
    return {
        "steps": steps,
        "k": k,
        "mean_predicted": float(sp.sum()) / steps,
        "mean_realised": float(sr.sum()) / steps,
        "length_ece": float(np.sum(np.abs(sp - sr)[count > 0]) / steps),
        "bins": bins,
    }
