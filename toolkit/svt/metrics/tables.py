"""Metric tables for one score: overall, per draft position, excluding the first position, with
request-level bootstrap intervals; acceptance by position; expected-length calibration.

Scores are sorted once; every per-position and bootstrap AUC reuses that order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from svt.metrics.calibration import LOG_EPS, mass_bin_index
from svt.metrics.ranking import auc_reason, auc_sorted
from svt.metrics.specs import names

NOT_PROBABILITY = "not a probability: log-loss, ECE and Brier need a fitted predictor (svt fit)"
METRICS = names("table")


@dataclass
class ScoreData:
    """One score's labelled rows, sorted by score once (ties in any order: every metric here
    treats tied scores as one group, except equal-mass bin edges, which may split ties)."""

    y: np.ndarray  # labels (0/1 or soft), float64
    s: np.ndarray  # scores, float64
    position: np.ndarray
    request: np.ndarray  # request keys, for the request-level bootstrap
    order: np.ndarray  # argsort of s
    # gathers shared between tables of one order (several features, hard and soft labels)
    cache: dict = field(default_factory=dict, repr=False)

    def _gather(self, name: str, arr: np.ndarray, dtype=None) -> np.ndarray:
        key = (name, id(self.order), id(arr))
        if key not in self.cache:
            g = arr[self.order]
            self.cache[key] = g if dtype is None else g.astype(dtype)
        return self.cache[key]

    def with_labels(self, y) -> ScoreData:
        """The same scores and order with other labels (soft-label variants)."""
        return ScoreData(np.asarray(y, dtype=np.float64), self.s, self.position, self.request,
                         self.order, self.cache)

    @classmethod
    def build(cls, y, s, position, request, *, order_hints: list[np.ndarray] | None = None,
              cache: dict | None = None) -> ScoreData:
        """``order_hints``: argsorts of other scores; one that also sorts ``s`` is reused (a
        monotone transform of that score: q_max and logit(q_max) share one sort). A new sort is
        appended to the list."""
        y = np.asarray(y, dtype=np.float64)
        s = np.asarray(s, dtype=np.float64)
        if not np.isfinite(s).all():
            raise ValueError(f"Expected finite scores, but got {int((~np.isfinite(s)).sum())} NaN/inf values.")
        order = None
        for hint in order_hints or []:
            ss = s[hint] if hint.size == s.size else None
            if ss is not None and (ss[1:] >= ss[:-1]).all():
                order = hint
                break
        if order is None:
            order = _argsort(s)
            if order_hints is not None:
                order_hints.append(order)
        return cls(y, s, np.asarray(position), np.asarray(request), order,
                   cache if cache is not None else {})

    def sorted_view(self, probability: bool) -> dict[str, np.ndarray]:
        v = {"y": self.y[self.order], "s": self._gather("s", self.s),
             "position": self._gather("position", self.position, np.int16)}
        if probability:
            p = np.clip(v["s"], LOG_EPS, 1 - LOG_EPS)
            y = v["y"]
            if np.isin(y, (0.0, 1.0)).all():  # hard labels: one log per row
                v["ll"] = -np.log(np.where(y == 1.0, p, 1 - p))
            else:
                v["ll"] = -(y * np.log(p) + (1 - y) * np.log1p(-p))
            v["sq"] = (v["s"] - y) ** 2
        return v


def _argsort(s: np.ndarray) -> np.ndarray:
    """argsort of float64 scores, via float32 keys (faster) when that order also sorts ``s``."""
    order = np.argsort(s.astype(np.float32))
    ss = s[order]
    return order if (ss[1:] >= ss[:-1]).all() else np.argsort(s)


def _bins(idx, n_bins, w, s, y):
    if w is None:
        return (np.bincount(idx, minlength=n_bins).astype(np.float64),
                np.bincount(idx, weights=s, minlength=n_bins), np.bincount(idx, weights=y, minlength=n_bins))
    return (np.bincount(idx, weights=w, minlength=n_bins), np.bincount(idx, weights=w * s, minlength=n_bins),
            np.bincount(idx, weights=w * y, minlength=n_bins))


def _scope_metrics(v: dict, w: np.ndarray | None, *, probability: bool, n_bins: int) -> dict:
    """Every metric for rows given in score order (``v`` from ``ScoreData.sorted_view``)."""
    y, s = v["y"], v["s"]
    out: dict = {"n": int(y.size)}
    total = float(y.size) if w is None else float(w.sum())
    if y.size == 0 or total <= 0:
        out.update({m: None for m in METRICS if m != "n"})
        out["reasons"] = {"auc": "no labelled drafts"}
        return out

    def mean(a):
        return float(a.sum() / total) if w is None else float(np.dot(w, a) / total)

    out["accept_rate"] = mean(y)
    reasons = {}
    pos_w = y if w is None else w * y
    auc = auc_sorted(s, pos_w, (1 - y) if w is None else w - pos_w)
    if np.isnan(auc):
        out["auc"] = None
        reasons["auc"] = auc_reason(y, w)
    else:
        out["auc"] = auc
    if probability:
        out["log_loss"], out["brier"], out["mean_pred"] = mean(v["ll"]), mean(v["sq"]), mean(s)
        width_idx = np.minimum((s * n_bins).astype(np.int64), n_bins - 1)
        mass_idx = mass_bin_index(s, w, total, n_bins)
        for key, idx in (("ece", width_idx), ("ece_mass", mass_idx)):
            cnt, sp, sy = _bins(idx, n_bins, w, s, y)
            out[key] = float(np.abs(sp - sy).sum() / total)
    else:
        for key in names("table", probability=True):
            out[key] = None
            reasons[key] = NOT_PROBABILITY
    if reasons:
        out["reasons"] = reasons
    return out


def _subset(v: dict, idx) -> dict:
    return {k: a[idx] for k, a in v.items()}


def bootstrap_intervals(d: ScoreData, positions, *, probability: bool, n_bins: int = 10, n: int = 0,
                        seed: int = 0) -> dict:
    """The request-level bootstrap intervals of every scope of one score's table: ``overall``,
    ``excluding_first`` and each of ``positions``, from the same ``n`` resamples of the requests
    (the point metrics come from :func:`svt.metrics.ordered.score_tables`)."""
    v = d.sorted_view(probability)
    _, group = np.unique(d.request[d.order], return_inverse=True)
    scopes = {"overall": None, "excluding_first": v["position"] > 0, **{k: v["position"] == k for k in positions}}
    return bootstrap_cis(v, group, scopes, probability=probability, n_bins=n_bins, n=n, seed=seed)


def bootstrap_ci(v: dict, group: np.ndarray, mask: np.ndarray | None, *, probability: bool,
                 n_bins: int, n: int, seed: int = 0, level: float = 0.95) -> dict:
    """Percentile intervals from ``n`` request-level resamples (whole requests drawn with
    replacement: their drafts are correlated, rows are not independent). ``v`` and ``group`` are
    in score order; ``mask`` selects a scope."""
    return bootstrap_cis(v, group, {"scope": mask}, probability=probability, n_bins=n_bins, n=n,
                         seed=seed, level=level)["scope"]


def bootstrap_cis(v: dict, group: np.ndarray, scopes: dict, *, probability: bool, n_bins: int, n: int,
                  seed: int = 0, level: float = 0.95) -> dict:
    """:func:`bootstrap_ci` for several scopes (masks in score order, None = all) from the *same*
    resamples of the requests, so the intervals of a scope and its parts are consistent."""
    rng = np.random.default_rng(seed)
    _, group = np.unique(group, return_inverse=True)
    n_groups = int(group.max()) + 1 if group.size else 0
    parts = {name: (v, group) if mask is None else (_subset(v, mask), group[mask]) for name, mask in scopes.items()}
    draws: dict = {name: {} for name in scopes}
    for _ in range(n if n_groups else 0):
        counts = rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups)).astype(np.float64)
        for name, (sv, sg) in parts.items():
            w = counts[sg]
            if not w.any():  # an empty scope, or no drawn request reaches it
                continue
            m = _scope_metrics(sv, w, probability=probability, n_bins=n_bins)
            for key in names("table", compared=True):
                if m.get(key) is not None:
                    draws[name].setdefault(key, []).append(m[key])
    lo, hi = (1 - level) / 2 * 100, (1 + level) / 2 * 100
    return {name: {k: [float(np.percentile(x, lo)), float(np.percentile(x, hi))] for k, x in d.items()}
            for name, d in draws.items()}


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
    steps = sum(p.size for p in predicted)
    if steps == 0:
        return {"steps": 0, "bins": [], "mean_predicted": None, "mean_realised": None, "length_ece": None}
    count, sp, sr = np.zeros(n_bins, np.int64), np.zeros(n_bins), np.zeros(n_bins)
    tot_p = tot_r = 0.0
    for pred, real in zip(predicted, realised, strict=True):
        pred, real = pred.astype(np.float64), real.astype(np.float64)
        idx = np.minimum((pred / k * n_bins).astype(np.int64), n_bins - 1)
        count += np.bincount(idx, minlength=n_bins)
        sp += np.bincount(idx, weights=pred, minlength=n_bins)
        sr += np.bincount(idx, weights=real, minlength=n_bins)
        tot_p += float(pred.sum())
        tot_r += float(real.sum())
    bins = [
        {"lo": i * k / n_bins, "hi": (i + 1) * k / n_bins, "count": int(count[i]),
         "mean_predicted": float(sp[i] / count[i]), "mean_realised": float(sr[i] / count[i])}
        for i in range(n_bins) if count[i]
    ]
    return {
        "steps": int(steps),
        "k": k,
        "mean_predicted": tot_p / steps,
        "mean_realised": tot_r / steps,
        "length_ece": float(np.sum(np.abs(sp - sr)[count > 0]) / steps),
        "bins": bins,
    }
