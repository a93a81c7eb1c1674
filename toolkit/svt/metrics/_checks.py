"""Input checks shared by the metrics: named helpers, messages of the form "Expected ... but got ..."."""

from __future__ import annotations

import numpy as np


def check_arrays(y_true, y_score, sample_weight=None, *, soft: bool = True, probability: bool = False):
    """Float64 copies of labels (0/1, or soft in [0, 1]), scores and weights, all the same length."""
    y = np.asarray(y_true, dtype=np.float64).ravel()
    s = np.asarray(y_score, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise ValueError(f"Expected `y_true` and `y_score` of one length, but got {y.size} and {s.size}.")
    if not np.isfinite(s).all():
        raise ValueError(f"Expected finite `y_score`, but got {int((~np.isfinite(s)).sum())} NaN/inf values.")
    if np.isnan(y).any() or (y < 0).any() or (y > 1).any():
        raise ValueError("Expected `y_true` in [0, 1] (0/1 labels or soft labels), but got values outside.")
    if not soft and not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("Expected 0/1 labels in `y_true`, but got other values.")
    if probability and ((s < 0).any() or (s > 1).any()):
        raise ValueError("Expected probabilities in [0, 1] in `y_score`, but got values outside.")
    if sample_weight is None:
        w = np.ones_like(s)
    else:
        w = np.asarray(sample_weight, dtype=np.float64).ravel()
        if w.shape != s.shape:
            raise ValueError(f"Expected `sample_weight` of length {s.size}, but got {w.size}.")
        if (w < 0).any() or not np.isfinite(w).all():
            raise ValueError("Expected non-negative finite `sample_weight`.")
    return y, s, w
