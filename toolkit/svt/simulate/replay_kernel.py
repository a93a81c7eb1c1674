"""The AV replay's per-step choices as compiled loops (numba), every engine step of a concurrency
at once: the budget rule, the causal draft lengths and the oracle's Dinkelbach picks.

Each function walks the steps in time order; a step's rows are ``rows[starts[g]:starts[g + 1]]``
of arrays already gathered in that order (``conf`` ``[R, K]``, ``a`` ``[R]``), and its size is
``n = starts[g + 1] - starts[g]``. Costs come as tables indexed by the batch size ``n``:
``curves[off[n] : off[n] + n K + 1]`` is the verify-cost curve over a step's token range
``n .. n (K + 1)`` (as measured, or its convex minorant), ``draft[n, k]`` the draft cost of k
tokens, ``verify[n, t]`` the measured verify cost of t tokens over n rows. The arithmetic is that of the numpy
definitions in :mod:`svt.simulate.av`, operation for operation (sequential sums and products, the
same tie rules), so the replay gives the same numbers bit for bit; tests hold the two together.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _keep_one(conf, lo, n, K, curves, off, draft_cost, out):
    """av_keep for one step: drafts kept by each of its rows (into ``out[lo:lo + n]``)."""
    m = n * K
    vals = np.empty(m)
    for i in range(n):  # position-major: a stable sort by survival keeps (position, row) order
        s = 1.0
        for j in range(K):
            s *= conf[lo + i, j]
            vals[j * n + i] = -s
    order = np.argsort(vals, kind="mergesort")
    base = off[n]
    best, best_b = -np.inf, 0
    acc = 0.0
    for b in range(m + 1):
        if b > 0:
            acc += -vals[order[b - 1]]
        ratio = (n + acc) / (draft_cost + curves[base + b])
        if ratio > best:
            best, best_b = ratio, b
    for i in range(n):
        out[lo + i] = 0
    for t in range(best_b):
        out[lo + order[t] % n] += 1


@njit(cache=True, nogil=True)
def av_kept(conf, starts, curves, off, draft_k, out):
    """The AV budget rule at every step: ``out[r]`` = drafts kept by row r; ``draft_k[n]`` = draft(n, K)."""
    K = conf.shape[1]
    for g in range(starts.size - 1):
        lo, n = starts[g], starts[g + 1] - starts[g]
        _keep_one(conf, lo, n, K, curves, off, draft_k[n], out)


@njit(cache=True, nogil=True)
def draft_lengths_all(conf, starts, next_conf, curves, off, draft, out):
    """The causal draft lengths of ``av.draft_lengths`` at every step, with how many rows shared
    each extra pass learned from the previous step of the same batch size (``av._av_length``)."""
    K = conf.shape[1]
    n_max = draft.shape[0] - 1
    sharing = np.zeros((n_max + 1, K))
    seen = np.zeros(n_max + 1, dtype=np.bool_)
    surv = np.empty(K)
    for g in range(starts.size - 1):
        lo, n = starts[g], starts[g + 1] - starts[g]
        v0, v1 = curves[off[n]], curves[off[n] + 1]
        rate = n / v0
        per_token = v1 - v0
        for i in range(n):
            s = 1.0
            length = 1
            for j in range(K):
                s *= conf[lo + i, j]
                surv[j] = s
            for j in range(K - 1):
                share = max(1.0, sharing[n, j]) if seen[n] else float(n)
                extra_pass = (draft[n, j + 2] - draft[n, j + 1]) / share
                if length == j + 1 and surv[j] * next_conf[j + 1] > (extra_pass + per_token) * rate:
                    length = j + 2
            out[lo + i] = length
        for j in range(K):
            c = 0
            for i in range(n):
                if out[lo + i] > j + 1:
                    c += 1
            sharing[n, j] = c
        seen[n] = True


@njit(cache=True, nogil=True)
def av_length_kept(conf, starts, lengths, curves, off, draft_k, out):
    """AV on what each row drafted (confidences past its length read as 0), capped at its length."""
    K = conf.shape[1]
    drafted = conf.copy()
    for r in range(conf.shape[0]):
        for j in range(lengths[r], K):
            drafted[r, j] = 0.0
    for g in range(starts.size - 1):
        lo, n = starts[g], starts[g + 1] - starts[g]
        _keep_one(drafted, lo, n, K, curves, off, draft_k[n], out)
    for r in range(conf.shape[0]):
        out[r] = min(out[r], lengths[r])


@njit(cache=True, nogil=True)
def _oracle_best(a, starts, draft, verify, K, lam, pick_k, pick_b):
    """Each step's option maximising tokens - lam * time (first in (k, b) order); the totals."""
    tok_sum, time_sum = 0.0, 0.0
    for g in range(starts.size - 1):
        lo, n = starts[g], starts[g + 1] - starts[g]
        best, bk, bb = -np.inf, 0, 0
        for k in range(K + 1):
            bmax = 0
            for i in range(n):
                bmax += min(a[lo + i], k)
            d = draft[n, k]
            for b in range(bmax + 1):
                t = float(n + b)
                m = d + verify[n, n + b]
                val = t - lam * m
                if val > best:
                    best, bk, bb = val, k, b
        pick_k[g], pick_b[g] = bk, bb
        tok_sum += float(n + bb)
        time_sum += draft[n, bk] + verify[n, n + bb]
    return tok_sum, time_sum


@njit(cache=True, nogil=True)
def oracle_steps(a, starts, draft, verify, K, iters, tokens, ms):
    """Dinkelbach's picks (``av.oracle_choices``), then each step's tokens per row (the b verified
    accepted drafts spread over the rows in order) and time."""
    G = starts.size - 1
    pick_k = np.zeros(G, dtype=np.int64)
    pick_b = np.zeros(G, dtype=np.int64)
    lam = 0.0
    for _ in range(iters):
        tok, time = _oracle_best(a, starts, draft, verify, K, lam, pick_k, pick_b)
        new = tok / time
        if abs(new - lam) <= 1e-12 * max(1.0, new):
            break
        lam = new
    for g in range(G):
        lo, n = starts[g], starts[g + 1] - starts[g]
        b = pick_b[g]
        before = 0
        for i in range(n):
            tokens[lo + i] = 1.0 + min(a[lo + i], max(0, b - before))
            before += a[lo + i]
        ms[g] = draft[n, pick_k[g]] + verify[n, n + b]
