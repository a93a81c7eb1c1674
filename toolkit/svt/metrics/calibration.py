"""Calibration metrics for probability scores: log-loss, Brier score, ECE (equal width / equal mass).

All take ``(y_true, y_prob, *, sample_weight=None)``; labels may be soft (in [0, 1]).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from svt.metrics._checks import check_arrays

LOG_EPS = np.finfo(np.float64).eps  # scikit-learn clips float64 probabilities to [eps, 1 - eps]


def mass_bin_index(s_sorted: np.ndarray, w: np.ndarray | None, total: float, n_bins: int) -> np.ndarray:
    """Equal-mass bin of each row of ascending scores: by the weight before its tie group, so tied
    scores always share a bin (and the result does not depend on the order within ties)."""
    cw = np.arange(s_sorted.size, dtype=np.float64) if w is None else np.cumsum(w) - w
    first = np.r_[True, s_sorted[1:] != s_sorted[:-1]]
    cw = cw[np.flatnonzero(first)][np.cumsum(first) - 1]
    return np.minimum((cw / total * n_bins).astype(np.int64), n_bins - 1)


def log_loss(y_true, y_prob, *, sample_weight=None) -> float:
    """Mean negative log-likelihood (nats); agrees with scikit-learn's ``log_loss``.

    >>> round(log_loss([1, 0], [0.8, 0.4]), 6)
    0.366985
    """
    y, p, w = check_arrays(y_true, y_prob, sample_weight, probability=True)
    p = np.clip(p, LOG_EPS, 1 - LOG_EPS)
    return float(-np.sum(w * (y * np.log(p) + (1 - y) * np.log1p(-p))) / w.sum())


def brier(y_true, y_prob, *, sample_weight=None) -> float:
    """Mean squared error of the probability.

    >>> brier([1, 0], [0.8, 0.4])
    0.1
    """
    y, p, w = check_arrays(y_true, y_prob, sample_weight, probability=True)
    return float(np.sum(w * (p - y) ** 2) / w.sum())


def calibration_bins(y_true, y_prob, *, sample_weight=None, n_bins: int = 10,
                     strategy: Literal["width", "mass"] = "width") -> dict[str, np.ndarray]:
    """Per-bin weight, mean prediction and observed rate (empty bins have weight 0).

    ``width``: bins of equal width on [0, 1] (1.0 falls in the last bin). ``mass``: bins holding
    about equal total weight after sorting by prediction; tied predictions share a bin.
    """
    y, p, w = check_arrays(y_true, y_prob, sample_weight, probability=True)
    if n_bins < 1:
        raise ValueError(f"Expected `n_bins` >= 1, but got {n_bins}.")
    if strategy == "width":
        idx = np.minimum((p * n_bins).astype(np.int64), n_bins - 1)
    elif strategy == "mass":
        order = np.argsort(p, kind="stable")
        idx = np.empty_like(order)
        idx[order] = mass_bin_index(p[order], w[order], w.sum(), n_bins)
    else:
        raise ValueError(f"Expected `strategy` 'width' or 'mass', but got {strategy!r}.")
    weight = np.bincount(idx, weights=w, minlength=n_bins)
    sum_p = np.bincount(idx, weights=w * p, minlength=n_bins)
    sum_y = np.bincount(idx, weights=w * y, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"weight": weight, "mean_pred": sum_p / weight, "rate": sum_y / weight,
                "count": np.bincount(idx, minlength=n_bins)}


def ece(y_true, y_prob, *, sample_weight=None, n_bins: int = 10,
        strategy: Literal["width", "mass"] = "width") -> float:
    """Expected calibration error: sum over bins of (bin weight share) * |mean prediction - rate|.

    >>> round(ece([1, 0, 1, 1], [0.9, 0.1, 0.8, 0.3], n_bins=2), 6)
    0.225
    """
    b = calibration_bins(y_true, y_prob, sample_weight=sample_weight, n_bins=n_bins, strategy=strategy)
    filled = b["weight"] > 0
    gap = np.abs(b["mean_pred"][filled] - b["rate"][filled])
    return float(np.sum(b["weight"][filled] * gap) / b["weight"].sum())
