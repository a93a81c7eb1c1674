"""The online estimator's prequential replay as one compiled loop (numba).

The replay is sequential: each cycle's refit uses predictions made with the previous cycle's
coefficients, so it cannot be vectorised across cycles, and a cycle holds only a few hundred
drafts, so numpy's per-call overhead (about 20 calls per refit) dominated the replay. This loop does
exactly what `IRLSOnline._update` does, row by row; `tests/fit/test_irls_kernel.py` holds it to the
numpy implementation.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, error_model="numpy")
def _sigmoid(z):
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@njit(cache=True, nogil=True, error_model="numpy")  # x / 0 is inf or nan, as in numpy
def replay(x, pos, y, step, cycle_steps, label_delay, k, per_position_slope, init_slope, init_intercept, damping, ridge,
           min_obs, reject_negative_slope, prequential, path_cycle, path_rows, path_slope, path_intercepts):
    """Score every row with the coefficients in force in its cycle (``step // cycle_steps``) and
    refit at the end of each cycle from the labels that have arrived (a label arrives in cycle
    ``(step + label_delay) // cycle_steps``); rows sorted by ``step``.
    Fills ``prequential`` and the path arrays; returns the number of refits.

    Long because it is one compiled loop that mirrors ``IRLSOnline._update`` row by row; numba keeps
    the accumulators in registers only within one function."""
    n = x.size
    n_w = k if per_position_slope else 1
    w = np.full(n_w, init_slope)
    b = np.full(k, init_intercept)
    n_k = np.zeros(k)
    g_b = np.zeros(k)
    h_bb = np.zeros(k)
    h_wb = np.zeros(k)
    g_w = np.zeros(k)
    h_ww = np.zeros(k)
    H = np.zeros((k + 1, k + 1))
    g = np.zeros(k + 1)
    scored = 0
    a = 0
    refits = 0
    min_rows = max(min_obs, 1)
    while scored < n or a < n:
        # the next cycle: the smallest of the next scoring cycle and the next arrival cycle
        if scored < n and (a >= n or step[scored] // cycle_steps <= (step[a] + label_delay) // cycle_steps):
            c = step[scored] // cycle_steps
        else:
            c = (step[a] + label_delay) // cycle_steps
        while scored < n and step[scored] // cycle_steps <= c:  # this cycle's drafts, scored as they come
            p_i = pos[scored]
            ww = w[p_i] if per_position_slope else w[0]
            prequential[scored] = _sigmoid(ww * x[scored] + b[p_i])
            scored += 1
        end = a
        while end < n and (step[end] + label_delay) // cycle_steps <= c:
            end += 1
        if end == a:
            continue
        n_k[:] = 0.0
        g_b[:] = 0.0
        h_bb[:] = 0.0
        h_wb[:] = 0.0
        g_w[:] = 0.0
        h_ww[:] = 0.0
        for i in range(a, end):  # gradient and Hessian of the log-loss at the coefficients in force
            p_i = pos[i]
            f = x[i]
            pr = prequential[i]
            r = pr - y[i]
            v = pr * (1.0 - pr)
            n_k[p_i] += 1.0
            g_b[p_i] += r
            h_bb[p_i] += v
            h_wb[p_i] += v * f
            g_w[p_i] += r * f
            h_ww[p_i] += v * f * f
        if per_position_slope:  # one 2x2 Newton system per position
            for q in range(k):
                a11 = h_ww[q] + ridge
                a12 = h_wb[q]
                a22 = h_bb[q] + ridge
                det = a11 * a22 - a12 * a12
                d_w = -(a22 * g_w[q] - a12 * g_b[q]) / det
                d_b = -(-a12 * g_w[q] + a11 * g_b[q]) / det
                damp = n_k[q] / (n_k[q] + damping) if damping > 0 else 1.0
                new_w = w[q] + damp * d_w
                new_b = b[q] + damp * d_b
                ok = n_k[q] >= min_rows and math.isfinite(new_w) and math.isfinite(new_b)
                if reject_negative_slope and new_w < 0:
                    ok = False
                if ok:
                    w[q] = new_w
                    b[q] = new_b
        else:
            H[:, :] = 0.0
            gw_all = 0.0
            hww_all = 0.0
            for q in range(k + 1):
                H[q, q] = ridge
            for q in range(k):
                gw_all += g_w[q]
                hww_all += h_ww[q]
                H[0, q + 1] = h_wb[q]
                H[q + 1, 0] = h_wb[q]
                H[q + 1, q + 1] += h_bb[q]
                g[q + 1] = -g_b[q]
            H[0, 0] += hww_all
            g[0] = -gw_all
            d = np.linalg.solve(H, g)
            n_all = 0.0
            for q in range(k):
                n_all += n_k[q]
            if damping > 0:
                d[0] *= n_all / (n_all + damping)
                for q in range(k):
                    d[q + 1] *= n_k[q] / (n_k[q] + damping)
            for q in range(k):
                if n_k[q] < min_rows:
                    d[q + 1] = 0.0
            if n_all < min_rows:
                d[0] = 0.0
            new_w = w[0] + d[0]
            if not (reject_negative_slope and new_w < 0):
                w[0] = new_w
                for q in range(k):
                    b[q] += d[q + 1]
        path_cycle[refits] = c
        path_rows[refits] = end - a
        path_slope[refits, :] = w
        path_intercepts[refits, :] = b
        refits += 1
        a = end
    return refits
