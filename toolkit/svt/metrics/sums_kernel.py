"""The unordered pass of a probability score (`svt.metrics.ordered`) as one compiled loop (numba):
each row read once, in row order, into per-position sums of the rows, the label, the score, the
log-loss and squared-error terms and the equal-width bins, and the same over all rows for each soft
label. The terms are those of the numpy pass (`ordered._score_sums_numpy`, kept as the
reference); sums differ from it only by float64 rounding of a different summation order. The
score, soft-label, log-loss and squared-error sums are compensated (Neumaier): a running total over 10^8 rows
would lose about 1e-11 of itself, these stay within a few units of the last place of the exactly
rounded sum (what a cluster's pairwise sums give, `svt.distributed.summaries`)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, inline="always")
def _add(sums, comp, j, c, v):
    """``sums[j, c] += v`` with Neumaier's compensation carried in ``comp[j, c]``."""
    a = sums[j, c]
    t = a + v
    if abs(a) >= abs(v):
        comp[j, c] += (a - t) + v
    else:
        comp[j, c] += (v - t) + a
    sums[j, c] = t


@njit(cache=True, nogil=True)
def score_sums(s, words, soft32, soft_cols, weights, use_weights, k, n_bins, eps, sums, bins):
    """``s``: scores in [0, 1]; ``words``: the packed records as uint32 words (word 0: label in the
    low byte, position in the high half); ``soft32``: the same memory as float32, soft label ``c``
    in column ``soft_cols[c]``. Scopes ``j`` (rows of ``sums`` and ``bins``): ``0..k-1`` the
    positions (hard labels), ``k + c`` soft label ``c`` over all rows. ``sums[j]``: rows, label,
    score, log-loss and squared-error sums; ``bins[j, 0 | 1 | 2, bin]``: rows, score and label
    sums of the equal-width bins. ``weights``: row weights when ``use_weights``. Log-loss clips
    the score to ``[eps, 1 - eps]``."""
    m_soft = soft_cols.size
    comp = np.zeros_like(sums)
    lp = l1p = 0.0
    for r in range(s.size):
        x = np.float64(s[r])
        w0 = words[r, 0]
        p = np.int64(w0 >> np.uint32(16))
        y = np.float64(w0 & np.uint32(255))
        wt = weights[r] if use_weights else 1.0
        cell = min(int(x * n_bins), n_bins - 1)
        c = min(max(x, eps), 1.0 - eps)
        # a 0/1 label picks one term: one logarithm a row, of c or of 1 - c (selected, no branch; 1 - c
        # as scikit-learn's log_loss takes it), the same with or without soft labels
        ll = -np.log(y * c + (1.0 - y) * (1.0 - c))
        if m_soft:  # soft labels weigh both terms
            lp = np.log(c)
            l1p = np.log1p(-c)
        sums[p, 0] += wt
        sums[p, 1] += wt * y
        _add(sums, comp, p, 2, wt * x)
        _add(sums, comp, p, 3, wt * ll)
        _add(sums, comp, p, 4, wt * (x - y) * (x - y))
        bins[p, 0, cell] += wt
        bins[p, 1, cell] += wt * x
        bins[p, 2, cell] += wt * y
        for q in range(m_soft):
            t = np.float64(soft32[r, soft_cols[q]])
            j = k + q
            sums[j, 0] += wt
            _add(sums, comp, j, 1, wt * t)
            _add(sums, comp, j, 2, wt * x)
            _add(sums, comp, j, 3, wt * -(t * lp + (1.0 - t) * l1p))
            _add(sums, comp, j, 4, wt * (x - t) * (x - t))
            bins[j, 0, cell] += wt
            bins[j, 1, cell] += wt * x
            bins[j, 2, cell] += wt * t
    sums += comp
