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


@njit(cache=True, nogil=True)
def identity_chunk(sbits, pbits, consts, x, n_proj, acc, sketch):
    """Add one chunk's rows to ``acc`` (uint64[4]: the structure hash's two sums, then the exact
    hash's; sums wrap modulo 2**64) and ``sketch`` (float64[p_cols, n_proj]).

    ``sbits`` [structure columns, rows] and ``pbits`` [score columns, rows]: each value's bit
    pattern as uint64 (a null as all ones); ``consts``: each column's salt, structure columns
    first; ``x`` [score columns, rows]: the scores as float64 (null and NaN as 0)."""
    ns, n = sbits.shape
    npc = pbits.shape[0]
    for r in range(n):
        h = _GOLDEN
        for i in range(ns):
            h = _mix(h ^ _mix(sbits[i, r] + consts[i]))
        acc[0] += h
        acc[1] += _mix(h ^ _SECOND)
        if npc:
            g = _mix(h ^ _SIGNS)
            for j in range(n_proj):
                sign = float((g >> np.uint64(j)) & _ONE) * 2.0 - 1.0  # no branch: the loop vectorises
                for c in range(npc):
                    sketch[c, j] += sign * x[c, r]
        e = h
        for i in range(npc):
            e = _mix(e ^ _mix(pbits[i, r] + consts[ns + i]))
        acc[2] += e
        acc[3] += _mix(e ^ _SECOND)
