"""Metrics of yield predictors (predicted accepted length of a cache draft): squared and absolute
error, and precision / recall / F1 of "high yield" (accepted length >= a threshold, 6 by default as
in the Hybrid Verified Decoding paper), with the precision-recall curve from scikit-learn.

>>> r = high_yield_prf(np.array([7, 0, 6, 2]), np.array([6.5, 6.1, 1.0, 0.0]), threshold=6)
>>> (r["precision"], r["recall"])
(0.5, 0.5)
"""

from __future__ import annotations

import numpy as np


def yield_errors(y_true: np.ndarray, y_pred: np.ndarray) -> dict:
    """Mean squared and mean absolute error, and the mean yields."""
    y_true, y_pred = np.asarray(y_true, dtype=np.float64), np.asarray(y_pred, dtype=np.float64)
    if y_true.size == 0:
        return {"mse": float("nan"), "mae": float("nan"), "mean_true": float("nan"), "mean_pred": float("nan"), "n": 0}
    e = y_pred - y_true
    return {"mse": float(np.mean(e * e)), "mae": float(np.mean(np.abs(e))), "mean_true": float(y_true.mean()),
            "mean_pred": float(y_pred.mean()), "n": int(y_true.size)}


def high_yield_prf(y_true: np.ndarray, y_pred: np.ndarray, *, threshold: float = 6) -> dict:
    """Precision, recall and F1 of predicting ``y_true >= threshold`` by ``y_pred >= threshold``,
    plus the average precision of ``y_pred`` as a ranking of high-yield drafts. Undefined values
    (no predicted or no true positives) are NaN with a reason."""
    from sklearn.metrics import average_precision_score

    t = np.asarray(y_true) >= threshold
    p = np.asarray(y_pred, dtype=np.float64) >= threshold
    tp = int(np.sum(t & p))
    out = {"threshold": threshold, "positives": int(t.sum()), "predicted_positives": int(p.sum()), "tp": tp,
           "precision": tp / int(p.sum()) if p.sum() else float("nan"),
           "recall": tp / int(t.sum()) if t.sum() else float("nan"), "reasons": []}
    pr, rc = out["precision"], out["recall"]
    out["f1"] = 2 * pr * rc / (pr + rc) if np.isfinite(pr) and np.isfinite(rc) and pr + rc > 0 else float("nan")
    if not p.sum():
        out["reasons"].append("no draft predicted high-yield: precision undefined")
    if t.any() and not t.all():
        out["average_precision"] = float(average_precision_score(t, y_pred))
    else:
        out["average_precision"] = float("nan")
        out["reasons"].append("high-yield drafts are all or none: recall / average precision undefined")
    return out


def pr_curve(y_true: np.ndarray, y_pred: np.ndarray, *, threshold: float = 6, points: int = 200) -> dict:
    """The precision-recall curve of ranking drafts by ``y_pred`` for ``y_true >= threshold``
    (scikit-learn's), thinned to at most ``points`` points."""
    from sklearn.metrics import precision_recall_curve

    t = np.asarray(y_true) >= threshold
    if not t.any() or t.all():
        return {}
    prec, rec, thr = precision_recall_curve(t, y_pred)
    keep = np.unique(np.linspace(0, prec.size - 1, min(points, prec.size)).astype(int))
    return {"precision": prec[keep].tolist(), "recall": rec[keep].tolist()}


def yield_block(y: np.ndarray, p: np.ndarray, high_yield: int, curve: bool = True) -> dict:
    """Errors, precision / recall of high-yield predictions and (``curve``) the precision-recall curve."""
    block = {**yield_errors(y, p), **high_yield_prf(y, p, threshold=high_yield)}
    if curve:
        block["pr_curve"] = pr_curve(y, p, threshold=high_yield)
    return block
