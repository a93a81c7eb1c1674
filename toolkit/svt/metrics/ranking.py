"""ROC AUC, exact, with ties counted half, sample weights and soft labels.

AUC = P(score of a random positive > score of a random negative) + 0.5 P(tie). With weights w and
soft labels y in [0, 1], each row counts as a positive with weight w * y and as a negative with
weight w * (1 - y), and only pairs of **distinct** rows count (a row's positive part is never
compared with its own negative part, which would be a tie pulling the AUC toward 0.5); for 0/1
labels and unit weights this is scikit-learn's ``roc_auc_score``.
"""

from __future__ import annotations

import numpy as np

from svt.metrics._checks import check_arrays


def auc_sorted(s_sorted: np.ndarray, pos: np.ndarray, neg: np.ndarray) -> float:
    """AUC from scores sorted ascending and the positive / negative weights in the same order."""
    if s_sorted.size == 0:
        return float("nan")
    starts = np.flatnonzero(np.r_[True, s_sorted[1:] != s_sorted[:-1]])
    P = np.add.reduceat(pos, starts)
    N = np.add.reduceat(neg, starts)
    total_p, total_n = P.sum(), N.sum()
    if total_p <= 0 or total_n <= 0:
        return float("nan")
    below = np.cumsum(N) - N
    self_pairs = float(np.dot(pos, neg))  # 0 for hard labels
    den = total_p * total_n - self_pairs
    if den <= 0:
        return float("nan")
    return float((np.dot(P, below + 0.5 * N) - 0.5 * self_pairs) / den)


def roc_auc(y_true, y_score, *, sample_weight=None) -> float:
    """Area under the ROC curve; NaN when only one class is present (undefined, see ``auc_reason``).

    >>> roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
    0.75
    >>> roc_auc([0, 1], [0.5, 0.5])
    0.5
    >>> round(roc_auc([0.9, 0.1], [1.0, 0.0]), 4)  # soft labels: distinct pairs only
    0.9878
    """
    y, s, w = check_arrays(y_true, y_score, sample_weight)
    order = np.argsort(s, kind="stable")
    return auc_sorted(s[order], (w * y)[order], (w * (1 - y))[order])


def auc_reason(y_true, sample_weight=None) -> str | None:
    """Why AUC is undefined for these labels, or None when it is defined."""
    y = np.asarray(y_true, dtype=np.float64)
    w = np.ones_like(y) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    if y.size == 0:
        return "no labelled drafts"
    if (w * y).sum() <= 0:
        return f"only one class (all {y.size} labelled drafts rejected)"
    if (w * (1 - y)).sum() <= 0:
        return f"only one class (all {y.size} labelled drafts accepted)"
    return None
