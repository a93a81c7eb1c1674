"""The online estimator running inside a live-AV collection (the source document's deployment).

It starts from the fit file's initial options (w = 1, b = 0 by default), scores every draft with
the coefficients in force, learns from the labels the target produces (only verified drafts carry
one), refits every ``cycle_steps`` engine steps, and verifies every draft during the first
``warmup_refits`` refits so that its early labels are not censored by its own trimming.
"""

from __future__ import annotations

import numpy as np

from svt.features import get_feature
from svt.fit.irls_online import IRLSOnline, OnlineOptions


class OnlineLive:
    def __init__(self, options: OnlineOptions, k: int):
        self.est = IRLSOnline(options)
        self.est._init(k)
        self.feature = get_feature(options.feature)
        self.steps = 0
        self.refits = 0
        self._pending: list[tuple[np.ndarray, ...]] = []
        self._inflight: list[tuple[np.ndarray, ...]] = []
        self._last = None

    def confidence(self, feats: dict, position: np.ndarray) -> np.ndarray:
        import polars as pl

        from svt.features import feature_values

        frame = pl.DataFrame({k: v.ravel() for k, v in feats.items()})
        x = feature_values(self.feature, frame)
        pos = position.ravel().astype(np.int64)
        p = self.est.predict_proba(x, pos)
        self._last = (x, pos, p)
        return p.reshape(position.shape)

    def observe(self, labels: np.ndarray) -> None:
        """The labels of the step just verified; they reach the estimator ``label_delay`` steps
        later (a refit at a cycle's end lacks the labels still in flight)."""
        x, pos, p = self._last
        # the step's drafts as last scored (``pos`` [rows * L]); an AV+length step drafts L <= K
        # positions while its labels come widened to the run's K (-1 past what was drafted)
        width = pos.size // max(labels.shape[0], 1)
        if pos.size != labels.shape[0] * width or labels.shape[1] < width:
            raise ValueError(f"Expected the labels of the {pos.size} drafts last scored, but got {labels.shape}.")
        y = labels[:, :width].ravel()
        m = y >= 0
        self._inflight.append((x[m], pos[m], y[m].astype(np.float64), p[m]))
        self.steps += 1
        while len(self._inflight) > self.est.options.label_delay:
            self._pending.append(self._inflight.pop(0))
        if self.steps % self.est.options.cycle_steps == 0 and self._pending:
            xs, ps, ys, pp = (np.concatenate(a) for a in zip(*self._pending, strict=True))
            if ys.size:
                self.est._update(xs, ps, ys, pp)
            self.est.path_.append({"cycle": self.refits, "rows": int(ys.size),
                                   "slope": self.est.slope_.tolist(), "intercepts": self.est.intercepts_.tolist()})
            self.refits += 1
            self._pending = []

    def warming_up(self) -> bool:
        return self.refits < self.est.options.warmup_refits
