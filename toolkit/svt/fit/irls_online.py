"""The online acceptance estimator of the source document.

    p = sigmoid(w * x + b_position),   x = a feature of the draft distribution (logit(q_max))

K + 1 parameters (one shared slope, one intercept per draft position), starting from w = 1, b = 0
("q_max used as is"). Drafts are replayed in decode-step order; over each cycle of N decode steps
the gradient g = sum (p - y) x and Hessian H = sum p (1 - p) x x^T of the log-loss are accumulated
with the coefficients in force (x = [feature, one-hot(position)]); at the cycle's end H d = -g is
solved with a small ridge, each coefficient's step is damped by n / (n + c) where n is the number of
labelled drafts behind it in the cycle, and the coefficients are updated. Memory is O(K^2).

Every draft is scored with the coefficients in force when it was drafted: ``prequential_`` holds
those predictions, the honest evaluation of an online fitter.

Options cover the serving engine's variant (as read in the code of a public vLLM version of its
online acceptance estimator): per-position slopes (2K parameters, one 2x2 system per position), other initial values, a minimum count per position and cycle below which a
position keeps its coefficients, and discarding refits that would make a slope negative.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np
import polars as pl
from scipy.special import expit

from svt.errors import ConfigError, DataError
from svt.fit.base import FitData, Fitter, check_positions, feature_values, register_fitter
from svt.fit.files import config, describe, finite, integer, need, text


@dataclass
class OnlineOptions:
    feature: str = "logit_qmax"
    cycle_steps: int = 10  # N: decode (engine) steps per cycle (measured: see README, svt fit)
    damping: float = 500.0  # c in n / (n + c)
    ridge: float = 1e-3
    per_position_slope: bool = False
    init_slope: float = 1.0
    init_intercept: float = 0.0
    min_obs: int = 0  # a position with fewer labels in a cycle keeps its coefficients
    reject_negative_slope: bool = False
    warmup_refits: int = 0  # refits during which live AV verifies everything (used by live AV)
    # decode steps before a draft's label reaches the estimator: in a serving engine the label of a
    # step's drafts arrives with the next step, so a refit at a cycle's end lacks its last step's
    # labels (they join the next cycle). 0 = labels available within their own step.
    label_delay: int = 1

    def validate(self) -> OnlineOptions:
        from svt.errors import ConfigError

        checks = (("cycle_steps", self.cycle_steps >= 1, "an integer >= 1"),
                  ("damping", 0 <= self.damping < np.inf, "a finite number >= 0"),
                  ("ridge", 0 <= self.ridge < np.inf, "a finite number >= 0"),
                  ("min_obs", self.min_obs >= 0, "an integer >= 0"),
                  ("label_delay", self.label_delay >= 0, "an integer >= 0"),
                  ("warmup_refits", self.warmup_refits >= 0, "an integer >= 0"),
                  ("init_slope", np.isfinite(self.init_slope), "a finite number"),
                  ("init_intercept", np.isfinite(self.init_intercept), "a finite number"))
        for key, ok, expected in checks:
            if not ok:
                raise ConfigError(f"Expected `{key}` to be {expected}, but got {getattr(self, key)!r}.")
        return self


PRESETS = {
    "source": OnlineOptions(),
    # the serving engine's variant, as read in the code of a public vLLM version of its online
    # acceptance estimator: logit margin, per-position slope and intercept, refit every 100 steps
    # from that round alone, min 50 observations, no damping
    "vllm": OnlineOptions(feature="logit_margin", cycle_steps=100, per_position_slope=True, init_slope=0.0,
                          init_intercept=1.5, min_obs=50, reject_negative_slope=True, damping=0.0,
                          warmup_refits=3),
}


@dataclass
class IRLSOnline:
    """Online IRLS with per-position intercepts (estimator contract: options in, ``fit`` sets the
    trailing-underscore attributes)."""

    options: OnlineOptions = field(default_factory=OnlineOptions)
    k: int = 0

    def _init(self, k: int) -> None:
        o = self.options
        self.k = k
        self.slope_ = np.full(k if o.per_position_slope else 1, o.init_slope, dtype=np.float64)
        self.intercepts_ = np.full(k, o.init_intercept, dtype=np.float64)
        self.path_: list[dict] = []
        self._ridge_eye = o.ridge * np.eye(k + 1)
        self._diag = np.arange(1, k + 1)

    def predict_proba(self, x: np.ndarray, position: np.ndarray) -> np.ndarray:
        w = self.slope_[position] if self.options.per_position_slope else self.slope_[0]
        return expit(w * x + self.intercepts_[position])

    def fit(self, x: np.ndarray, position: np.ndarray, y: np.ndarray, step: np.ndarray,
            *, k: int | None = None, compiled: bool = True) -> IRLSOnline:
        """Replay labelled drafts. ``step`` is each draft's decode-step index (non-decreasing: the
        rows must already be in replay order); a draft is scored in cycle ``step // cycle_steps``
        and its label joins the refit at the end of cycle ``(step + label_delay) // cycle_steps``.

        ``compiled``: run the replay as one compiled loop (`svt.fit.irls_kernel`, the default) or
        as numpy calls per cycle (the reference implementation, same numbers to rounding)."""
        # one dtype per argument, writable and contiguous: the compiled loop then has one signature
        # (numba types a read-only array, as polars hands out, as another type); copies are made
        # only where an input differs (a replay of 10^8 drafts holds no second copy)
        x = np.require(x, np.float64, ["C", "W"])
        position = np.require(position, np.int16, ["C", "W"])
        y8 = np.require(y, np.int8, ["C", "W"])
        if y8 is not y and not np.array_equal(y8, y):
            raise ValueError("Expected 0/1 labels in `y`.")
        y = y8
        step = np.require(step, np.int64, ["C", "W"])
        if step.size and (step[1:] < step[:-1]).any():
            raise ValueError("Expected rows in replay order (non-decreasing `step`).")
        self._init(int(position.max()) + 1 if k is None else k)
        o = self.options
        self.prequential_ = np.empty(y.size, dtype=np.float64)
        if compiled:
            from svt.fit.irls_kernel import replay

            # at most one refit per cycle between the first and the last label's arrival
            m = ((int(step[-1]) + o.label_delay) // o.cycle_steps - int(step[0]) // o.cycle_steps + 1
                 if step.size else 0)
            n_w = self.k if o.per_position_slope else 1
            pc, pr = np.zeros(m, np.int64), np.zeros(m, np.int64)
            pw, pb = np.zeros((m, n_w)), np.zeros((m, self.k))
            done = replay(x, position, y, step, int(o.cycle_steps), int(o.label_delay), int(self.k),
                          bool(o.per_position_slope), float(o.init_slope), float(o.init_intercept),
                          float(o.damping), float(o.ridge), int(o.min_obs), bool(o.reject_negative_slope),
                          self.prequential_, pc, pr, pw, pb)
            if done:
                self.slope_, self.intercepts_ = pw[done - 1].copy(), pb[done - 1].copy()
            self._path = None  # the list of dicts is built when first read
            self._path_arrays = (pc[:done], pr[:done], pw[:done], pb[:done])
            return self
        cycle = step // o.cycle_steps  # when each draft is scored
        arrive = (step + o.label_delay) // o.cycle_steps  # the refit its label joins
        position, y = position.astype(np.int64), y.astype(np.float64)
        path = []
        scored = 0
        for c in np.unique(np.r_[cycle, arrive]):
            end = int(np.searchsorted(cycle, c, side="right"))
            if end > scored:  # drafts of cycle c: scored with the coefficients in force
                self.prequential_[scored:end] = self.predict_proba(x[scored:end], position[scored:end])
                scored = end
            a, b = np.searchsorted(arrive, c, side="left"), np.searchsorted(arrive, c, side="right")
            if b > a:  # the labels that have arrived by the end of cycle c (all scored already)
                self._update(x[a:b], position[a:b], y[a:b], self.prequential_[a:b])
                path.append((c, b - a, self.slope_.copy(), self.intercepts_.copy()))
        self.path_ = [{"cycle": int(c), "rows": int(n), "slope": w.tolist(), "intercepts": bb.tolist()}
                      for c, n, w, bb in path]
        return self

    def _update(self, f, pos, yy, p) -> None:
        o, K = self.options, self.k
        r, v = p - yy, p * (1 - p)
        vf = v * f
        n_k = np.bincount(pos, minlength=K).astype(np.float64)
        g_b = np.bincount(pos, weights=r, minlength=K)
        h_bb = np.bincount(pos, weights=v, minlength=K)
        h_wb = np.bincount(pos, weights=vf, minlength=K)
        active = n_k >= max(o.min_obs, 1)
        if o.per_position_slope:  # one independent 2x2 Newton system per position
            g_w = np.bincount(pos, weights=r * f, minlength=K)
            h_ww = np.bincount(pos, weights=vf * f, minlength=K)
            a11, a12, a22 = h_ww + o.ridge, h_wb, h_bb + o.ridge
            det = a11 * a22 - a12 * a12
            with np.errstate(divide="ignore", invalid="ignore"):  # det 0: a NaN step, not taken
                d_w = -(a22 * g_w - a12 * g_b) / det
                d_b = -(-a12 * g_w + a11 * g_b) / det
            damp = n_k / (n_k + o.damping) if o.damping > 0 else np.ones(K)
            new_w = self.slope_ + damp * d_w
            new_b = self.intercepts_ + damp * d_b
            ok = active & np.isfinite(new_w) & np.isfinite(new_b)
            if o.reject_negative_slope:
                ok &= new_w >= 0
            self.slope_ = np.where(ok, new_w, self.slope_)
            self.intercepts_ = np.where(ok, new_b, self.intercepts_)
            return
        H = self._ridge_eye.copy()  # ridge * I, made once per fit
        H[0, 0] += float(np.dot(vf, f))
        H[0, 1:] = H[1:, 0] = h_wb
        H[self._diag, self._diag] += h_bb
        g = np.empty(K + 1)
        g[0], g[1:] = np.dot(r, f), g_b
        d = np.linalg.solve(H, -g)
        n_all = float(n_k.sum())
        if o.damping > 0:
            d[0] *= n_all / (n_all + o.damping)
            d[1:] *= n_k / (n_k + o.damping)
        d[1:][~active] = 0.0
        if n_all < max(o.min_obs, 1):
            d[0] = 0.0
        new_w = self.slope_[0] + d[0]
        if o.reject_negative_slope and new_w < 0:
            return
        self.slope_[0] = new_w
        self.intercepts_ = self.intercepts_ + d[1:]

    @property
    def path_(self) -> list[dict]:
        """One entry per refit: the cycle, the rows it used, and the coefficients after it."""
        if getattr(self, "_path", None) is None:
            arrays = getattr(self, "_path_arrays", None)
            if arrays is None:
                return []
            self._path = [{"cycle": c, "rows": r, "slope": w, "intercepts": bb}
                          for c, r, w, bb in zip(*(a.tolist() for a in arrays), strict=True)]
        return self._path

    @path_.setter
    def path_(self, value: list[dict]) -> None:
        self._path = value
        self._path_arrays = None

    def coefficients_at(self, cycles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Slopes ``[n, K or 1]`` and intercepts ``[n, K]`` in force during each given cycle: the
        state after the last update of an earlier cycle (the initial state before any)."""
        o = self.options
        w0 = np.full(self.k if o.per_position_slope else 1, o.init_slope)
        b0 = np.full(self.k, o.init_intercept)
        done = np.array([e["cycle"] for e in self.path_], dtype=np.int64)
        W = np.vstack([w0, *(np.atleast_1d(e["slope"]) for e in self.path_)])
        B = np.vstack([b0, *(e["intercepts"] for e in self.path_)])
        idx = np.searchsorted(done, cycles, side="left")  # number of updates strictly before
        return W[idx], B[idx]

    def predict_prequential(self, x: np.ndarray, position: np.ndarray, step: np.ndarray) -> np.ndarray:
        """Each row scored with the coefficients in force at its decode step (any rows of the
        replayed stream, labelled or not)."""
        cycles = np.asarray(step, dtype=np.int64) // self.options.cycle_steps
        W, B = self.coefficients_at(cycles)
        position = np.asarray(position, dtype=np.int64)
        rows = np.arange(position.size)
        w = W[rows, position] if self.options.per_position_slope else W[:, 0]
        return expit(w * np.asarray(x, dtype=np.float64) + B[rows, position])

    @classmethod
    def from_dict(cls, d: dict) -> IRLSOnline:
        est = cls(OnlineOptions(**d["options"]))
        est.k = len(d["intercepts"])
        est.slope_ = np.atleast_1d(np.asarray(d["slope"], dtype=np.float64))
        est.intercepts_ = np.asarray(d["intercepts"], dtype=np.float64)
        est.path_ = d.get("path", [])
        return est

    def to_dict(self) -> dict:
        o = self.options
        return {
            "model": "irls-online",
            "feature": o.feature,
            "slope": self.slope_.tolist() if o.per_position_slope else float(self.slope_[0]),
            "intercepts": self.intercepts_.tolist(),
            "options": asdict(o),
            "path": self.path_,
        }


def check_path(path: list, k: int, n_w: int) -> None:
    """A fit file's coefficient path (``IRLSOnline.path_``): one entry per refit, in increasing
    cycles, each with its rows, ``n_w`` slopes and ``k`` intercepts, all finite."""
    if not isinstance(path, list):
        raise ConfigError(f"`path` is {describe(path)}, not a list of refits")
    last = -1
    for i, e in enumerate(path):
        at = f"path[{i}]"
        cycle = integer(e, "cycle", at)
        if cycle <= last:
            raise ConfigError(f"`{at}.cycle` is {cycle}, not after the cycle before it ({last})")
        integer(e, "rows", at)
        finite(e, "slope", (n_w,), at=at, why=f"{n_w} slope{'s' * (n_w > 1)} per refit")
        finite(e, "intercepts", (k,), at=at, why="one per position")
        last = cycle


@register_fitter
class IRLSOnlineFitter(Fitter):
    """``irls-online``: the source estimator replayed over the labelled drafts in decode-step order,
    scored prequentially (every draft with the coefficients in force when it was drafted)."""

    name = "irls-online"
    online = True
    plot_kinds = ("coefficients",)  # the coefficient path, one point per refit cycle
    extra_flags = ("--preset", "--cycle-steps", "--damping", "--ridge", "--label-delay")
    streams = True  # trains from replay arrays read shard by shard (`fit_arrays`)

    def __init__(self, online: OnlineOptions | None = None, feature: str | None = None,
                 per_position_slope: bool | None = None):
        opts = replace(online or OnlineOptions())  # a copy: the caller's options are not changed
        if feature is not None:
            opts.feature = feature
        if per_position_slope:
            opts.per_position_slope = True
        self.options = opts.validate()

    @property
    def feature(self) -> str:
        return self.options.feature

    # the fitted estimator's final coefficients and their path, as fitted attributes of the fitter
    slope_ = property(lambda self: self.est_.slope_, doc="Final slope (one, or one per position).")
    intercepts_ = property(lambda self: self.est_.intercepts_, doc="Final intercept per position.")
    path_ = property(lambda self: self.est_.path_, doc="Coefficients after each refit cycle.")

    def fit(self, data: FitData) -> IRLSOnlineFitter:
        lab = data.frame
        span = int(lab["decode_step"].max()) + 1 if lab.height else 0
        if self.options.label_delay >= max(span, 1):
            from svt.errors import ConfigError

            raise ConfigError(f"`label_delay` {self.options.label_delay} is not shorter than the run's {span} "
                              "decode steps: no label would reach the estimator while it runs.")
        self.est_ = IRLSOnline(self.options).fit(feature_values(lab, self.feature), lab["position"].to_numpy(),
                                                 lab["label"].to_numpy(), lab["decode_step"].to_numpy(), k=data.k)
        return self

    def fit_arrays(self, x: np.ndarray, position: np.ndarray, y: np.ndarray, decode_step: np.ndarray,
                   k: int) -> IRLSOnlineFitter:
        """:meth:`fit` on labelled drafts given as arrays in replay order (`svt.fit.replay_arrays`)."""
        span = int(decode_step[-1]) + 1 if decode_step.size else 0
        if self.options.label_delay >= max(span, 1):
            from svt.errors import ConfigError

            raise ConfigError(f"`label_delay` {self.options.label_delay} is not shorter than the run's {span} "
                              "decode steps: no label would reach the estimator while it runs.")
        if not np.isfinite(x).all():
            raise DataError(f"Feature {self.feature!r} gives NaN/inf values on these drafts; a fit is neither trained nor scored on them.")
        self.est_ = IRLSOnline(self.options).fit(x, position, y, decode_step, k=k)
        self.est_.prequential_ = None  # 8 bytes per draft; `predict` replays again
        return self

    def predict(self, frame, ctx=None) -> np.ndarray:
        """Replays the estimator on ``frame``'s labelled rows and scores every row with the
        coefficients in force at its decode step."""
        check_positions(frame, self.est_.k)
        lab = frame.filter(pl.col("label").is_not_null())
        if lab.height == 0:
            raise DataError("No labelled drafts to replay the online estimator on.")
        est = IRLSOnline(self.options).fit(feature_values(lab, self.feature), lab["position"].to_numpy(),
                                           lab["label"].to_numpy(), lab["decode_step"].to_numpy(), k=self.est_.k)
        return est.predict_prequential(feature_values(frame, self.feature), frame["position"].to_numpy(),
                                       frame["decode_step"].to_numpy())

    def to_dict(self) -> dict:
        return self.est_.to_dict()

    @classmethod
    def check_fields(cls, d: dict) -> None:
        opts = config(d, "options", OnlineOptions)
        try:
            o = OnlineOptions(**opts).validate()
        except ConfigError as exc:
            raise ConfigError(f"`options`: {exc}") from None
        if "feature" in d and text(d, "feature") != o.feature:
            raise ConfigError(f"`feature` {d['feature']!r} and `options.feature` {o.feature!r} disagree")
        k = finite(d, "intercepts", (None,)).size
        pp = o.per_position_slope
        finite(d, "slope", (k,) if pp else (), why=f"`options.per_position_slope` is {str(pp).lower()} and the "
                                                  f"fit has {k} positions: expected " +
                                                  (f"a list of {k} numbers" if pp else "one number"))
        check_path(need(d, "path"), k, k if pp else 1)

    @classmethod
    def from_dict(cls, d: dict, path=None) -> IRLSOnlineFitter:
        self = cls(OnlineOptions(**d["options"]))
        self.est_ = IRLSOnline.from_dict(d)
        return self

    def summary(self) -> list[str]:
        """The coefficients, and a warning when no refit moved them from their start (every cycle
        short of ``min_obs`` labels at each position, or every refit rejected): the fit then
        predicts with its initial coefficients throughout."""
        o, est = self.options, self.est_
        if np.all(est.slope_ == o.init_slope) and np.all(est.intercepts_ == o.init_intercept):
            why = (f"every cycle of {o.cycle_steps} decode steps had fewer than {o.min_obs} labels at each position, "
                   "or every refit was rejected; try a larger --cycle-steps" if o.min_obs else "every refit was rejected")
            return [*super().summary(), f"WARNING: no refit moved the coefficients from their start ({why})"]
        return super().summary()

    def label(self) -> str:
        return f"irls-online({self.feature})" + (" per-position slope" if self.options.per_position_slope else "")
