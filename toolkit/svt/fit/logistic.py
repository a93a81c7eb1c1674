"""Logistic acceptance models with per-position intercepts, fitted offline by Newton's method.

    p = sigmoid(sum_j w_j x_j + b_position)                (shared slopes)
    p = sigmoid(sum_j w_{j,position} x_j + b_position)    (per-position slopes)

The sufficient statistics of one Newton step are sums over rows of (p - y) x and p (1 - p) x x^T,
where x = [features, one-hot(position)] (or with per-position slopes, the features placed in their
position's block): additive over shards, so a fit maps over data and reduces.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from svt.fit.base import FitData, Fitter, check_positions, feature_values, register_fitter
from svt.fit.files import finite, flag, integer, names, section, text


def design(features: np.ndarray, position: np.ndarray, k: int, *, per_position_slope: bool) -> np.ndarray:
    """Design matrix ``[n, d]``: slopes' columns first, then one intercept column per position.

    ``features`` is ``[n, m]``; shared slopes give d = m + k, per-position slopes d = m * k + k.
    """
    n, m = features.shape
    onehot = np.zeros((n, k))
    onehot[np.arange(n), position] = 1.0
    if per_position_slope:
        slopes = (features[:, :, None] * onehot[:, None, :]).reshape(n, m * k)
    else:
        slopes = features
    return np.concatenate([slopes, onehot], 1)


def newton_step_stats(X: np.ndarray, y: np.ndarray, beta: np.ndarray,
                      weight: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, float]:
    """Gradient g = X^T (p - y), Hessian H = X^T diag(p (1 - p)) X, and the summed log-loss."""
    z = X @ beta
    p = expit(z)
    w = np.ones_like(y) if weight is None else weight
    r = (p - y) * w
    v = p * (1 - p) * w
    g = X.T @ r
    H = (X * v[:, None]).T @ X
    # log-loss from z directly (stable): log(1 + e^z) - y z
    loss = float(np.sum(w * (np.logaddexp(0.0, z) - y * z)))
    return g, H, loss


def fit_newton(X: np.ndarray, y: np.ndarray, *, beta0: np.ndarray | None = None, ridge: float = 0.0,
               tol: float = 1e-10, max_iter: int = 100) -> tuple[np.ndarray, int]:
    """Maximum-likelihood logistic regression (no penalty unless ``ridge``) by damped Newton.

    Converges when the Newton decrement is below ``tol``; step halving keeps the loss decreasing.
    Returns (coefficients, iterations).
    """
    beta = np.zeros(X.shape[1]) if beta0 is None else beta0.astype(np.float64).copy()
    eye = np.eye(X.shape[1])
    _, _, loss = newton_step_stats(X, y, beta)
    loss += 0.5 * ridge * beta @ beta
    for it in range(1, max_iter + 1):
        g, H, _ = newton_step_stats(X, y, beta)
        g = g + ridge * beta
        H = H + ridge * eye
        step = np.linalg.lstsq(H, -g, rcond=None)[0]
        decrement = float(-g @ step)
        t = 1.0
        while True:
            cand = beta + t * step
            _, _, new_loss = newton_step_stats(X, y, cand)
            new_loss += 0.5 * ridge * cand @ cand
            if new_loss <= loss + 1e-12 * abs(loss) or t < 1e-8:
                break
            t *= 0.5
        beta, loss = cand, new_loss
        if decrement / max(1.0, len(y)) < tol:
            return beta, it
    return beta, max_iter


@register_fitter
class LogisticFitter(Fitter):
    """``logistic``: the online estimator's parametrisation (or per-position slopes, or several
    features) fitted offline by Newton on the training requests."""

    name = "logistic"
    row_wise = True

    def __init__(self, feature: str | None = None, features: list[str] | None = None,
                 per_position_slope: bool = False):
        self.features = list(features or [feature or "logit_qmax"])
        self.feature = self.features[0]
        self.per_position_slope = per_position_slope

    def fit(self, data: FitData) -> LogisticFitter:
        f, k = data.frame, data.k
        pos = f["position"].to_numpy()
        X = design(np.column_stack([feature_values(f, n) for n in self.features]), pos, k,
                   per_position_slope=self.per_position_slope)
        beta, self.iterations_ = fit_newton(X, f["label"].to_numpy().astype(np.float64))
        m = len(self.features)
        self.slope_ = beta[: m * k].reshape(m, k) if self.per_position_slope else beta[:m]
        self.intercepts_ = beta[-k:]
        return self

    def predict(self, frame, ctx=None) -> np.ndarray:
        check_positions(frame, self.intercepts_.size)
        pos = frame["position"].to_numpy()
        Xf = np.column_stack([feature_values(frame, n) for n in self.features])
        if self.per_position_slope:
            z = np.sum(Xf * self.slope_.reshape(len(self.features), -1)[:, pos].T, axis=1)
        else:
            z = Xf @ np.atleast_1d(self.slope_)
        return expit(z + self.intercepts_[pos])

    def to_dict(self) -> dict:
        m = len(self.features)
        s = np.asarray(self.slope_)
        slope = (s[0].tolist() if m == 1 else s.tolist()) if self.per_position_slope else \
            (float(s[0]) if m == 1 else s.tolist())
        return {"model": self.name, "feature": self.feature, "features": self.features, "slope": slope,
                "intercepts": self.intercepts_.tolist(),
                "options": {"per_position_slope": self.per_position_slope,
                            "newton_iterations": getattr(self, "iterations_", None)}}

    @classmethod
    def check_fields(cls, d: dict) -> None:
        feats = names(d, "features") if "features" in d else [text(d, "feature")]
        if "feature" in d:  # whether it is `features[0]` is checked with the names (`from_dict`)
            text(d, "feature")
        opts = section(d, "options", required=False)
        pp = flag(opts, "per_position_slope", at="options")
        k = finite(d, "intercepts", (None,)).size
        m = len(feats)
        if pp:  # as `fit` shapes it: [features, K], a feature's row alone when there is one
            shape, want = ((m, k), f"{m} lists of {k} numbers") if m > 1 else ((k,), f"a list of {k} numbers")
        else:
            shape, want = ((m,), f"a list of {m} numbers") if m > 1 else ((), "one number")
        finite(d, "slope", shape, why=f"`options.per_position_slope` is {str(pp).lower()} and the fit has {m} "
                                      f"feature{'s' * (m > 1)} and {k} positions: expected {want}")
        if opts.get("newton_iterations") is not None:
            integer(opts, "newton_iterations", at="options")

    @classmethod
    def from_dict(cls, d: dict, path=None) -> LogisticFitter:
        from svt.features import get_feature

        for name in [*(d.get("features") or []), *([d["feature"]] if d.get("feature") is not None else [])]:
            get_feature(name)  # an unknown name is one clear error
        if d.get("feature") is not None:
            if d.get("features") and d["features"][0] != d["feature"]:
                raise ValueError(f"`feature` {d['feature']!r} and `features` {d['features']!r} disagree")
        self = cls(features=d.get("features") or [d["feature"]],
                   per_position_slope=bool(d.get("options", {}).get("per_position_slope")))
        slope = np.asarray(d["slope"], dtype=np.float64)  # as `fit` shapes it: [features] or [features, K]
        self.slope_ = slope.reshape(len(self.features), -1) if self.per_position_slope else np.atleast_1d(slope)
        self.intercepts_ = np.asarray(d["intercepts"], dtype=np.float64)
        self.iterations_ = d.get("options", {}).get("newton_iterations")
        return self

    def label(self) -> str:
        return super().label() + (" per-position slope" if self.per_position_slope else "")
