"""Compiled walks (numba) over keys ``rank << 32 | row`` of `svt.metrics.ordered`: the keys of a
score made in one pass; whether a sorted order sorts a score or has its ranks, and the rewrite of an
order into the dense ranks of the float64 score. Each reads the score once per row, in the order's
sequence."""

from __future__ import annotations

import numpy as np
from numba import njit

_MASK = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


@njit(cache=True, nogil=True)
def float32_keys(s, out, first):
    """Write ``rank << 32 | row`` into ``out`` (unsorted): ``rank`` is ``s[row]`` rounded to float32
    (-0.0 as +0.0), its bit pattern made monotone (negative: every bit flipped; else the sign bit
    set); rows are numbered from ``first`` (``s`` and ``out`` may be a slice of the whole). Return
    whether every value was a float32 exactly (then equal ranks are equal scores)."""
    block = 4096
    buf = np.empty(block, dtype=np.float32)
    bits = buf.view(np.uint32)
    exact = True
    for a in range(0, s.size, block):
        m = min(block, s.size - a)
        for j in range(m):
            buf[j] = np.float32(s[a + j]) + np.float32(0.0)
            exact = exact and np.float64(buf[j]) == np.float64(s[a + j])
        for j in range(m):
            u = bits[j]
            u ^= (np.uint32(0) - (u >> np.uint32(31))) | np.uint32(0x80000000)
            out[a + j] = (np.uint64(u) << _SHIFT) | np.uint64(first + a + j)
    return exact


@njit(cache=True, nogil=True)
def fill_float32(v, out):
    """Write ``v`` rounded to float32 into ``out``; return whether every value was a float32 exactly
    (then ``out`` holds ``v`` without loss)."""
    exact = True
    for i in range(v.size):
        out[i] = np.float32(v[i])
        exact = exact and np.float64(out[i]) == np.float64(v[i])
    return exact


@njit(cache=True, nogil=True)
def has_ranks(key, s):
    """Whether ``s`` ascends along the sorted ``key``, rising exactly where its ranks rise."""
    prev_v = 0.0
    prev_r = np.uint64(0)
    for i in range(key.size):
        v = np.float64(s[key[i] & _MASK])
        rk = key[i] >> _SHIFT
        if i:
            if v < prev_v or (v > prev_v) != (rk != prev_r):
                return False
        prev_v = v
        prev_r = rk
    return True


@njit(cache=True, nogil=True)
def sorts(key, s):
    """Whether ``s`` does not descend along ``key``."""
    prev = 0.0
    for i in range(key.size):
        v = np.float64(s[key[i] & _MASK])
        if i and v < prev:
            return False
        prev = v
    return True


@njit(cache=True, nogil=True)
def _sort_segment(key, s, i, j, rank, last):
    """Keys ``i:j`` sorted by (``s``, row) and relabelled with dense ranks from ``rank`` (the rank
    before the segment, -1 at the start) and ``last`` (its score); returns the two after it."""
    rows = key[i:j] & _MASK
    o1 = np.argsort(rows, kind="mergesort")  # rows ascending, then a stable sort by s
    rows = rows[o1]
    vals = np.empty(rows.size, dtype=np.float64)
    for t in range(rows.size):
        vals[t] = s[rows[t]]
    o2 = np.argsort(vals, kind="mergesort")
    for t in range(rows.size):
        v = vals[o2[t]]
        if rank < 0 or v != last:
            rank += 1
            last = v
        key[i + t] = (np.uint64(rank) << _SHIFT) | rows[o2[t]]
    return rank, last


@njit(cache=True, nogil=True)
def segment_start(key, s, by_s, i):
    """The first row ``j >= max(i, 1)`` that opens a segment of :func:`dense_ranks` (its rank, or
    with ``by_s`` its score, differs from row ``j - 1``'s); ``key.size`` when there is none. Rows on
    either side of it have distinct scores, so a walk from there starts a new dense rank."""
    for j in range(max(i, 1), key.size):
        if by_s:
            if np.float64(s[key[j] & _MASK]) != np.float64(s[key[j - 1] & _MASK]):
                return j
        elif (key[j] >> _SHIFT) != (key[j - 1] >> _SHIFT):
            return j
    return key.size


SMALL = 64  # a segment out of order up to this many rows is sorted by insertion


@njit(cache=True, nogil=True)
def dense_ranks(key, s, by_s):
    """Rewrite ``key`` in place as ``dense rank << 32 | row`` of ``s``, sorted by (``s``, row), the
    ranks from 0; return the last rank (-1 when ``key`` is empty).

    The order must already put ``s`` in ascending order across segments: the segments are the
    runs of equal rank (``by_s`` False: a float32 sort, whose rounding is monotone but may merge
    distinct scores into one rank) or the runs of equal ``s`` (``by_s`` True: another score's order
    that sorts ``s`` but may split its ties out of row order). A segment is read into a buffer and
    relabelled, sorted first when it is out of (``s``, row) order; one longer than the buffer is
    sorted in place (`_sort_segment`). The buffers are never replaced inside the loop (rebinding
    an array there costs reference counts per row)."""
    n = key.size
    cap = 4096
    rows = np.empty(cap, dtype=np.uint64)
    vals = np.empty(cap, dtype=np.float64)
    rank = np.int64(-1)
    last = 0.0
    i = 0
    while i < n:
        v0 = np.float64(s[key[i] & _MASK])
        h0 = key[i] >> _SHIFT
        m = 0
        j = i
        ordered = True
        while j < n:
            r = key[j] & _MASK
            v = np.float64(s[r])
            if (v != v0) if by_s else ((key[j] >> _SHIFT) != h0):
                break
            if m < cap:
                rows[m] = r
                vals[m] = v
                if m and (v < vals[m - 1] or (v == vals[m - 1] and r < rows[m - 1])):
                    ordered = False
            m += 1
            j += 1
        if m > cap:
            rank, last = _sort_segment(key, s, i, j, rank, last)
        else:
            if not ordered and m <= SMALL:  # (s, row) order by insertion, in place: no array made
                for t in range(1, m):
                    r, v = rows[t], vals[t]
                    u = t - 1
                    while u >= 0 and (vals[u] > v or (vals[u] == v and rows[u] > r)):
                        rows[u + 1] = rows[u]
                        vals[u + 1] = vals[u]
                        u -= 1
                    rows[u + 1] = r
                    vals[u + 1] = v
            elif not ordered:  # (s, row) order: rows ascending, then a stable sort by s
                o1 = np.argsort(rows[:m], kind="mergesort")
                vs = vals[:m][o1]
                o2 = np.argsort(vs, kind="mergesort")
                rs = rows[:m][o1][o2]
                rows[:m] = rs
                vals[:m] = vs[o2]
            for t in range(m):
                if rank < 0 or vals[t] != last:
                    rank += 1
                    last = vals[t]
                key[i + t] = (np.uint64(rank) << _SHIFT) | rows[t]
        i = j
    return rank
