"""Metric tables for one score: overall, per draft position, excluding the first position, with
request-level bootstrap intervals; acceptance by position; expected-length calibration.

Scores are sorted once; every per-position and bootstrap AUC reuses that order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from svt.metrics.calibration import LOG_EPS, calibration_bins
from svt.metrics.ranking import _auc_sorted, auc_reason

NOT_PROBABILITY = "not a probability: log-loss, ECE and Brier need a fitted predictor (svt fit)"
METRICS = ("auc", "log_loss", "ece", "ece_mass", "brier", "mean_pred", "accept_rate", "n")


@dataclass
class ScoreData:
    """One score's labelled rows, sorted by score once."""

    y: np.ndarray  # labels (0/1 or soft), float64
    s: np.ndarray  # scores, float64
    position: np.ndarray
    group: np.ndarray  # request index (for the bootstrap), int64 in [0, n_groups)
    n_groups: int
    order: np.ndarray  # argsort of s

    @classmethod
    def build(cls, y, s, position, request) -> ScoreData:
        y = np.asarray(y, dtype=np.float64)
        s = np.asarray(s, dtype=np.float64)
        if not np.isfinite(s).all():
            raise ValueError(f"Expected finite scores, but got {int((~np.isfinite(s)).sum())} NaN/inf values.")
        uniq, group = np.unique(np.asarray(request), return_inverse=True)
        return cls(y, s, np.asarray(position), group.astype(np.int64), len(uniq),
                   np.argsort(s, kind="stable"))


def _metrics(d: ScoreData, mask_sorted: np.ndarray | None, w: np.ndarray | None, *,
             probability: bool, n_bins: int) -> dict:
    """Every metric on the rows selected by ``mask_sorted`` (a mask in sorted order)."""
    order = d.order if mask_sorted is None else d.order[mask_sorted]
    y, s = d.y[order], d.s[order]
    ww = np.ones_like(y) if w is None else w[order]
    out: dict = {"n": int(order.size)}
    total = ww.sum()
    if order.size == 0 or total <= 0:
        out.update({m: None for m in METRICS if m != "n"})
        out["reasons"] = {"auc": "no labelled drafts"}
        return out
    out["accept_rate"] = float(np.dot(ww, y) / total)
    reasons = {}
    auc = _auc_sorted(s, ww * y, ww * (1 - y))
    if np.isnan(auc):
        out["auc"] = None
        reasons["auc"] = auc_reason(y, ww)
    else:
        out["auc"] = auc
    if probability:
        p = np.clip(s, LOG_EPS, 1 - LOG_EPS)
        out["log_loss"] = float(-np.dot(ww, y * np.log(p) + (1 - y) * np.log1p(-p)) / total)
        out["brier"] = float(np.dot(ww, (s - y) ** 2) / total)
        out["mean_pred"] = float(np.dot(ww, s) / total)
        for key, strategy in (("ece", "width"), ("ece_mass", "mass")):
            b = calibration_bins(y, s, sample_weight=ww, n_bins=n_bins, strategy=strategy)
            filled = b["weight"] > 0
            out[key] = float(np.sum(b["weight"][filled] * np.abs(b["mean_pred"] - b["rate"])[filled]) / total)
    else:
        for key in ("log_loss", "brier", "mean_pred", "ece", "ece_mass"):
            out[key] = None
            reasons[key] = NOT_PROBABILITY
    if reasons:
        out["reasons"] = reasons
    return out


def score_table(d: ScoreData, *, probability: bool, n_bins: int = 10, bootstrap: int = 0,
                seed: int = 0) -> dict:
    """``overall``, ``excluding_first`` and ``per_position`` metrics (and bootstrap intervals)."""
    pos_sorted = d.position[d.order]
    table = {
        "overall": _metrics(d, None, None, probability=probability, n_bins=n_bins),
        "excluding_first": _metrics(d, pos_sorted > 0, None, probability=probability, n_bins=n_bins),
        "per_position": {
            int(k): _metrics(d, pos_sorted == k, None, probability=probability, n_bins=n_bins)
            for k in np.unique(d.position)
        },
    }
    if bootstrap:
        table["overall"]["ci95"] = bootstrap_ci(d, None, probability=probability, n_bins=n_bins,
                                                n=bootstrap, seed=seed)
        table["excluding_first"]["ci95"] = bootstrap_ci(d, pos_sorted > 0, probability=probability,
                                                        n_bins=n_bins, n=bootstrap, seed=seed)
    return table


def bootstrap_ci(d: ScoreData, mask_sorted, *, probability: bool, n_bins: int, n: int,
                 seed: int = 0, level: float = 0.95) -> dict:
    """Percentile intervals from ``n`` request-level resamples (whole requests drawn with
    replacement: their drafts are correlated, rows are not independent)."""
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {}
    for _ in range(n):
        counts = rng.multinomial(d.n_groups, np.full(d.n_groups, 1.0 / d.n_groups))
        m = _metrics(d, mask_sorted, counts[d.group].astype(np.float64), probability=probability,
                     n_bins=n_bins)
        for key in ("auc", "log_loss", "ece", "brier"):
            if m.get(key) is not None:
                draws.setdefault(key, []).append(m[key])
    lo, hi = (1 - level) / 2 * 100, (1 + level) / 2 * 100
    return {k: [float(np.percentile(v, lo)), float(np.percentile(v, hi))] for k, v in draws.items()}


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
    if per_step.height == 0:
        return {"steps": 0, "bins": [], "mean_predicted": None, "mean_realised": None, "length_ece": None}
    k = int(per_step["k"].max())
    pred, real = per_step["predicted"].to_numpy(), per_step["realised"].to_numpy()
    idx = np.minimum((pred / k * n_bins).astype(np.int64), n_bins - 1)
    count = np.bincount(idx, minlength=n_bins)
    sp = np.bincount(idx, weights=pred, minlength=n_bins)
    sr = np.bincount(idx, weights=real, minlength=n_bins)
    bins = [
        {"lo": i * k / n_bins, "hi": (i + 1) * k / n_bins, "count": int(count[i]),
         "mean_predicted": float(sp[i] / count[i]), "mean_realised": float(sr[i] / count[i])}
        for i in range(n_bins) if count[i]
    ]
    return {
        "steps": int(per_step.height),
        "k": k,
        "mean_predicted": float(pred.mean()),
        "mean_realised": float(real.mean()),
        "length_ece": float(np.sum(np.abs(sp - sr)[count > 0]) / per_step.height),
        "bins": bins,
    }
