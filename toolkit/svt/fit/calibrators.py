"""Calibrators of one score, fitted on the training requests: per-position temperature scaling
(``sts``), Platt scaling (``platt``) and isotonic regression (``isotonic``, scikit-learn's)."""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import expit, logit

from svt.errors import ConfigError
from svt.fit.base import FitData, Fitter, check_positions, feature_values, register_fitter
from svt.fit.files import finite, text
from svt.fit.logistic import fit_newton

EPS = 1e-6


@register_fitter
class STSFitter(Fitter):
    """``sts``: p = sigmoid(logit(q) / T_position), one temperature per draft position."""

    name = "sts"
    row_wise = True

    def __init__(self, feature: str | None = None):
        self.feature = feature or "q_max"

    def fit(self, data: FitData) -> STSFitter:
        q = np.clip(feature_values(data.frame, self.feature), EPS, 1 - EPS)
        y = data.frame["label"].to_numpy().astype(np.float64)
        pos = data.frame["position"].to_numpy()
        temps = []
        for kk in range(data.k):
            m = pos == kk
            if m.sum() == 0 or len(set(y[m])) < 2:
                temps.append(1.0)
                continue
            z, yy = logit(q[m]), y[m]

            def loss(log_t, z=z, yy=yy):
                zz = z / np.exp(log_t)
                return float(np.mean(np.logaddexp(0, zz) - yy * zz))

            temps.append(float(np.exp(minimize_scalar(loss, bounds=(-5, 5), method="bounded").x)))
        self.temperatures_ = np.asarray(temps)
        return self

    def predict(self, frame, ctx=None) -> np.ndarray:
        check_positions(frame, self.temperatures_.size)
        q = np.clip(feature_values(frame, self.feature), EPS, 1 - EPS)
        return expit(logit(q) / self.temperatures_[frame["position"].to_numpy()])

    def to_dict(self) -> dict:
        t = self.temperatures_.tolist()
        return {"model": self.name, "feature": self.feature, "temperatures": t,
                "slope": [1 / x for x in t], "intercepts": [0.0] * len(t),
                "options": {"note": "p = sigmoid(logit(q) / T_position)"}}

    @classmethod
    def check_fields(cls, d: dict) -> None:
        text(d, "feature")
        t = finite(d, "temperatures", (None,), positive=True, why="p = sigmoid(logit(q) / T_position)")
        # written beside the temperatures in the shape of a logistic fit, and derived from them: an
        # edit there would be ignored without a word
        if not np.allclose(finite(d, "slope", (t.size,), why="1 / T_position"), 1 / t, rtol=1e-12, atol=0):
            raise ConfigError("`slope` is not 1 / `temperatures` (sts reads its temperatures: edit those)")
        if np.any(finite(d, "intercepts", (t.size,), why="0 at each position") != 0):
            raise ConfigError("`intercepts` are not all 0 (sts has no intercepts)")

    @classmethod
    def from_dict(cls, d: dict, path=None) -> STSFitter:
        self = cls(d["feature"])
        self.temperatures_ = np.asarray(d["temperatures"], dtype=np.float64)
        return self


@register_fitter
class PlattFitter(Fitter):
    """``platt``: p = sigmoid(a * score + b), one intercept for all positions."""

    name = "platt"
    row_wise = True

    def __init__(self, feature: str | None = None):
        self.feature = feature or "q_max"

    def fit(self, data: FitData) -> PlattFitter:
        s = feature_values(data.frame, self.feature)
        beta, _ = fit_newton(np.column_stack([s, np.ones_like(s)]), data.frame["label"].to_numpy().astype(np.float64))
        self.a_, self.b_, self.k_ = float(beta[0]), float(beta[1]), data.k
        return self

    def predict(self, frame, ctx=None) -> np.ndarray:
        return expit(self.a_ * feature_values(frame, self.feature) + self.b_)

    def to_dict(self) -> dict:
        return {"model": self.name, "feature": self.feature, "slope": self.a_, "intercepts": [self.b_] * self.k_,
                "options": {"note": "p = sigmoid(a * score + b), one intercept for all positions"}}

    @classmethod
    def check_fields(cls, d: dict) -> None:
        text(d, "feature")
        finite(d, "slope", why="a in p = sigmoid(a * score + b)")
        b = finite(d, "intercepts", (None,), why="b, written once per position")
        if np.any(b != b[0]):
            raise ConfigError(f"`intercepts` differ by position ({b.tolist()}), but platt has one intercept "
                              "for all positions")

    @classmethod
    def from_dict(cls, d: dict, path=None) -> PlattFitter:
        self = cls(d["feature"])
        self.a_, self.b_, self.k_ = float(d["slope"]), float(d["intercepts"][0]), len(d["intercepts"])
        return self


@register_fitter
class IsotonicFitter(Fitter):
    """``isotonic``: scikit-learn's isotonic regression of the label on one score."""

    name = "isotonic"
    row_wise = True

    def __init__(self, feature: str | None = None):
        self.feature = feature or "q_max"

    def fit(self, data: FitData) -> IsotonicFitter:
        from sklearn.isotonic import IsotonicRegression

        iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0)
        iso.fit(feature_values(data.frame, self.feature), data.frame["label"].to_numpy())
        self.x_, self.y_ = iso.X_thresholds_, iso.y_thresholds_
        return self

    def predict(self, frame, ctx=None) -> np.ndarray:
        return np.interp(feature_values(frame, self.feature), self.x_, self.y_)

    def to_dict(self) -> dict:
        return {"model": self.name, "feature": self.feature, "x_thresholds": self.x_.tolist(),
                "y_thresholds": self.y_.tolist(), "options": {}}

    @classmethod
    def check_fields(cls, d: dict) -> None:
        text(d, "feature")
        x = finite(d, "x_thresholds", (None,))
        y = finite(d, "y_thresholds", (x.size,), why="one per x threshold")
        for key, a in (("x_thresholds", x), ("y_thresholds", y)):
            if np.any(np.diff(a) < 0):
                i = int(np.argmax(np.diff(a) < 0)) + 1
                raise ConfigError(f"`{key}[{i}]` is {a[i]:g}, below `{key}[{i - 1}]` {a[i - 1]:g}: "
                                  "an isotonic fit's thresholds increase")
        if np.any((y < 0) | (y > 1)):
            i = int(np.argmax((y < 0) | (y > 1)))
            raise ConfigError(f"`y_thresholds[{i}]` is {y[i]:g}, not a probability in [0, 1]")

    @classmethod
    def from_dict(cls, d: dict, path=None) -> IsotonicFitter:
        self = cls(d["feature"])
        self.x_ = np.asarray(d["x_thresholds"], dtype=np.float64)
        self.y_ = np.asarray(d["y_thresholds"], dtype=np.float64)
        return self
