"""The ordered pass of `svt.metrics.ordered` as one compiled loop (numba): the sorted keys walked
once, tie group by tie group, each row's record read in place (no gathered copy of the chunk, no
[group, scope] tables). For each group the positives and negatives of every position it touches,
of all rows and of the rows past the first position, and each soft label's weight, go straight
into the scopes' accumulators: AUC numerator with ties one half, positives and negatives so far,
equal-mass bins by the rows before the group, and the overall ROC points at chosen groups.

The numbers are those of the numpy pass (`ordered._ordered_pass_numpy`, kept as the reference):
the AUC sums are integers or half-integers (exact, in one walk or two); the equal-mass bins' score
sums and the soft labels' AUC sums differ only by float64 rounding of a different summation order."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def count_groups(high):
    """Tie groups (runs of equal values) in ``high``."""
    n = high.size
    if n == 0:
        return 0
    g = 1
    for i in range(1, n):
        if high[i] != high[i - 1]:
            g += 1
    return g


@njit(cache=True, nogil=True)
def group_start(high, i):
    """The first row ``j >= max(i, 1)`` whose rank differs from row ``j - 1``'s (a tie group opens
    there); ``high.size`` when there is none."""
    for j in range(max(i, 1), high.size):
        if high[j] != high[j - 1]:
            return j
    return high.size


@njit(cache=True, nogil=True)
def ordered_scan(high, low, words, soft32, soft_cols, s, weights, use_weights, probability, k, n_bins,
                 totals, roc_groups, acc, mass, roc_pos, roc_neg, mirror):
    """Walk keys sorted by ``high`` (rank) with rows ``low``. ``words``: the packed records as
    uint32 words (word 0: label in the low byte, position in the high half); ``soft32``: the same
    memory as float32, soft label ``c`` in column ``soft_cols[c]``.

    Scopes ``j`` (rows of ``acc``, ``mass`` and ``totals``, the rows of each): ``0..k-1`` the
    positions, ``k`` all rows, ``k+1`` rows past the first position, ``k+2+c`` soft label ``c``
    over all rows. ``acc[j]``: AUC numerator, positive and negative weight so far, rows before
    (probability only); ``mass[j, 0 | 1, bin]``: equal-mass bins' score and label sums.
    ``weights``: row weights when ``use_weights``. ``roc_groups``: ascending group indices at
    which the overall scope's positive and negative weight below are recorded.

    ``mirror``: the keys are walked from the highest rank down (reversed views of the end of an
    order); ``acc`` then counts the rows above each group, and a group's equal-mass bin is found from
    the rows below it, ``totals[j] - acc[j, 3] - W`` (`ordered._scan_in_halves` turns the rest
    around).

    Rows are read a block at a time: the block's records (and weights, soft labels, and the score of
    each group's first row) are gathered first, in a loop of independent loads the processor
    overlaps, then counted.

    Long because it is one compiled loop on purpose: a helper called per group with the
    accumulator arrays costs numba's reference counting of every array argument per call
    (measured: 5x slower on distinct scores)."""
    n = high.size
    m_soft = soft_cols.size
    Pg = np.zeros(k)
    Ng = np.zeros(k)
    seen = np.full(k, -1, dtype=np.int64)
    touched = np.empty(k, dtype=np.int64)
    ts = np.zeros(max(m_soft, 1))
    M = k + 2 + m_soft
    sj = np.empty(M, dtype=np.int64)  # the scopes a closing group updates, with their weights
    sP = np.empty(M)
    sN = np.empty(M)
    B = 4096
    bw = np.empty(B, dtype=np.uint32)
    bs = np.zeros(B, dtype=np.float64)
    bwt = np.ones(B, dtype=np.float64)
    bsoft = np.zeros((B, max(m_soft, 1)), dtype=np.float64)
    g = -1  # the open group
    ri = 0
    nt = 0
    sg = 0.0
    h = np.uint32(0)
    h_open = np.uint32(0)
    for i in range(n + 1):
        t = i % B
        if t == 0 and i < n:  # gather the next block
            for u in range(min(B, n - i)):
                r = low[i + u]
                bw[u] = words[r, 0]
                if probability and (i + u == 0 or high[i + u] != high[i + u - 1]):
                    bs[u] = s[r]  # a group's score is read at its first row only
                if use_weights:
                    bwt[u] = weights[r]
                for c in range(m_soft):
                    bsoft[u, c] = soft32[r, soft_cols[c]]
        if i < n:
            h = high[i]
        if g >= 0 and (i == n or h != h_open):  # close the open group into its scopes
            if ri < roc_groups.size and roc_groups[ri] == g:
                roc_pos[ri] = acc[k, 1]
                roc_neg[ri] = acc[k, 2]
                ri += 1
            Pa = 0.0
            Na = 0.0
            Pe = 0.0
            Ne = 0.0
            ns = 0
            for q in range(nt):  # positions in the order the group first met them
                p = touched[q]
                sj[ns] = p
                sP[ns] = Pg[p]
                sN[ns] = Ng[p]
                ns += 1
                Pa += Pg[p]
                Na += Ng[p]
                if p > 0:
                    Pe += Pg[p]
                    Ne += Ng[p]
                Pg[p] = 0.0
                Ng[p] = 0.0
            sj[ns] = k
            sP[ns] = Pa
            sN[ns] = Na
            sj[ns + 1] = k + 1
            sP[ns + 1] = Pe
            sN[ns + 1] = Ne
            ns += 2
            for c in range(m_soft):
                sj[ns] = k + 2 + c
                sP[ns] = ts[c]
                sN[ns] = (Pa + Na) - ts[c]
                ts[c] = 0.0
                ns += 1
            for q in range(ns):
                j = sj[q]
                P = sP[q]
                N = sN[q]
                if P == 0.0 and N == 0.0:
                    continue
                acc[j, 0] += P * (acc[j, 2] + 0.5 * N)
                if probability:
                    W = P + N
                    below = totals[j] - acc[j, 3] - W if mirror else acc[j, 3]
                    idx = int(below / totals[j] * n_bins)
                    idx = min(max(idx, 0), n_bins - 1)
                    mass[j, 0, idx] += W * sg
                    mass[j, 1, idx] += P
                    acc[j, 3] += W
                acc[j, 2] += N
                acc[j, 1] += P
        if i == n:
            break
        if g < 0 or h != h_open:  # open the next group
            g += 1
            nt = 0
            h_open = h
            sg = bs[t]
        w0 = bw[t]
        p = np.int64(w0 >> np.uint32(16))
        y = np.float64(w0 & np.uint32(255))
        wt = bwt[t]
        if seen[p] != g:
            seen[p] = g
            touched[nt] = p
            nt += 1
        Pg[p] += wt * y
        Ng[p] += wt * (1.0 - y)
        for c in range(m_soft):
            ts[c] += bsoft[t, c]
