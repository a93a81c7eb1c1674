"""The data identity's row hashes and score sketch as one compiled loop (numba): the same bits as
the numpy definition in :mod:`svt.traces.identity` (which stays the reference and is tested
against this), in one pass over a chunk instead of a dozen array passes per column."""

from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_SECOND = np.uint64(0xD6E8FEB86659FD93)
_SIGNS = np.uint64(0x5DEECE66D)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _ONE = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(1)


@njit(cache=True, nogil=True, inline="always")
def _mix(h):
    h = h ^ (h >> _S30)
    h = h * _M1
    h = h ^ (h >> _S27)
    h = h * _M2
    return h ^ (h >> _S31)


@njit(cache=True, nogil=True, inline="always")
def _hash_columns(h, bits, consts, first, a, m):
    """Continue the row hashes ``h[:m]`` over every column of ``bits`` (rows ``a:a+m``), column
    ``i`` salted with ``consts[first + i]``."""
    for i in range(bits.shape[0]):
        c = consts[first + i]
        for r in range(m):
            h[r] = _mix(h[r] ^ _mix(bits[i, a + r] + c))


@njit(cache=True, nogil=True, inline="always")
def _add_sums(h, m, acc, at):
    """Add the row hashes ``h[:m]`` to the order-free hash ``acc[at]``, ``acc[at + 1]`` (two mixes)."""
    s0 = np.uint64(0)
    s1 = np.uint64(0)
    for r in range(m):
        s0 += h[r]
        s1 += _mix(h[r] ^ _SECOND)
    acc[at] += s0
    acc[at + 1] += s1


@njit(cache=True, nogil=True, inline="always")
def _add_sketch(h, e, sign, x, off, n_c, n_proj, sketch, m):
    """Add rows ``off:off+m`` of the score columns ``x[:n_c]`` to ``sketch``: projection ``j``'s
    sign of a row is bit ``j`` of its structure hash ``h`` mixed once more (``e``, ``sign``: scratch)."""
    for r in range(m):
        e[r] = _mix(h[r] ^ _SIGNS)
    for j in range(n_proj):
        for r in range(m):
            sign[r] = float((e[r] >> np.uint64(j)) & _ONE) * 2.0 - 1.0
        for c in range(n_c):
            t = 0.0
            for r in range(m):
                t += sign[r] * x[c, off + r]
            sketch[c, j] += t


@njit(cache=True, nogil=True, fastmath=True)
def identity_chunk(sbits, pbits, consts, x, n_proj, acc, sketch, lo, hi):
    """Add rows ``lo:hi`` of a chunk to ``acc`` (uint64[4]: the structure hash's two sums, then the exact
    hash's; sums wrap modulo 2**64) and ``sketch`` (float64[p_cols, n_proj]).

    ``sbits`` [structure columns, rows] and ``pbits`` [score columns, rows]: each value's bit
    pattern as uint64 (a null as all ones); ``consts``: each column's salt, structure columns
    first; ``x`` [score columns, rows]: the scores as float64 (null and NaN as 0).

    Rows go a block at a time, column by column, so each loop runs the same hash over many rows at
    once (vector instructions) instead of one row's chain of dependent mixes; ``fastmath`` lets the
    sketch's sums be reassociated (the sketch is compared within a tolerance, the hashes are
    integers: exact)."""
    ns = sbits.shape[0]
    npc = pbits.shape[0]
    block = 1024
    h = np.empty(block, dtype=np.uint64)
    e = np.empty(block, dtype=np.uint64)
    sign = np.empty(block, dtype=np.float64)
    for a in range(lo, hi, block):
        m = min(block, hi - a)
        for r in range(m):
            h[r] = _GOLDEN
        _hash_columns(h, sbits, consts, 0, a, m)
        _add_sums(h, m, acc, 0)
        if npc:
            _add_sketch(h, e, sign, x, a, npc, n_proj, sketch, m)
        e[:m] = h[:m]
        _hash_columns(e, pbits, consts, ns, a, m)
        _add_sums(e, m, acc, 2)


_NULL = np.uint64(0xFFFFFFFFFFFFFFFF)


@njit(cache=True, nogil=True, inline="always")
def _hash_native(h, col, null, c, a, m):
    """Continue the row hashes ``h[:m]`` over rows ``a:a+m`` of one column given as unsigned
    integers of its own width (its bit patterns, widened here); ``null`` (bool, empty when the
    column has none): where true the value is all ones."""
    if null.size:
        for r in range(m):
            v = _NULL if null[a + r] else np.uint64(col[a + r])
            h[r] = _mix(h[r] ^ _mix(v + c))
    else:
        for r in range(m):
            h[r] = _mix(h[r] ^ _mix(np.uint64(col[a + r]) + c))


@njit(cache=True, nogil=True, inline="always")
def _load_scores(xb, c, x, a, m):
    """Rows ``a:a+m`` of one score column into ``xb[c]`` as float64, NaN as 0 (a null is 0 already)."""
    for r in range(m):
        v = np.float64(x[a + r])
        xb[c, r] = 0.0 if v != v else v


@njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def identity_columns(s, s_null, p, p_null, x, n_p, consts, n_proj, acc, sketch, lo, hi):
    """:func:`identity_chunk` reading the columns where they are: ``s`` the five structure columns
    (request, step, position, token, label) and ``p`` up to three score columns (the first ``n_p``
    read), each as unsigned integers of its own width, with its null mask (``s_null``, ``p_null``;
    empty when none); ``x``: the score columns' values (float32 or float64, a null as 0). No
    uint64 copy of each column, no float64 copy of the scores. ``fastmath`` only reassociates the
    sketch's sums (NaN tests stay)."""
    block = 1024
    h = np.empty(block, dtype=np.uint64)
    e = np.empty(block, dtype=np.uint64)
    sign = np.empty(block, dtype=np.float64)
    xb = np.zeros((3, block), dtype=np.float64)
    for a in range(lo, hi, block):
        m = min(block, hi - a)
        for r in range(m):
            h[r] = _GOLDEN
        _hash_native(h, s[0], s_null[0], consts[0], a, m)
        _hash_native(h, s[1], s_null[1], consts[1], a, m)
        _hash_native(h, s[2], s_null[2], consts[2], a, m)
        _hash_native(h, s[3], s_null[3], consts[3], a, m)
        _hash_native(h, s[4], s_null[4], consts[4], a, m)
        _add_sums(h, m, acc, 0)
        if n_p:
            if n_p > 0:
                _load_scores(xb, 0, x[0], a, m)
            if n_p > 1:
                _load_scores(xb, 1, x[1], a, m)
            if n_p > 2:
                _load_scores(xb, 2, x[2], a, m)
            _add_sketch(h, e, sign, xb, 0, n_p, n_proj, sketch, m)
        e[:m] = h[:m]
        if n_p > 0:
            _hash_native(e, p[0], p_null[0], consts[5], a, m)
        if n_p > 1:
            _hash_native(e, p[1], p_null[1], consts[6], a, m)
        if n_p > 2:
            _hash_native(e, p[2], p_null[2], consts[7], a, m)
        _add_sums(e, m, acc, 2)
