"""Per-step sums of drafts already in step order, as compiled loops (numba): where each step
opens (checking that positions ascend within it), then each step's accepted drafts, its draft
count and, per probability score, the sum over positions of the running product (the step's
expected accepted length under that score)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def step_sums(first, accepted, p, n_scores, out_a, out_k, out_p):
    """``first`` (per row, nonzero: the row opens a step; rows of a step are contiguous, positions
    ascending); ``accepted`` (uint8): the draft was accepted; ``p``: a tuple of float64 score columns,
    the first ``n_scores`` of them read. Adds into ``out_a``, ``out_k`` (int64, per step) and
    ``out_p`` [scores, steps] (zeros)."""
    n = accepted.size
    b = -1
    for r in range(n):
        if first[r]:
            b += 1
        out_a[b] += accepted[r]
        out_k[b] += 1
    for f in range(n_scores):  # one score at a time: a loop the compiler keeps in registers
        q = p[f]
        o = out_p[f]
        b = -1
        prod = 1.0
        for r in range(n):
            if first[r]:
                b += 1
                prod = 1.0
            prod *= q[r]
            o[b] += prod


@njit(cache=True, nogil=True)
def step_heads(run, request, step, position, first, low, span, last):
    """Mark in ``first`` the rows that open a step (the run, request or step changes from the row
    before). Return (steps, ascending): steps is -1 when a position does not ascend within a step;
    ascending: each request's steps ascend strictly from one opening row to the next, which makes
    every step one run of rows. ``last`` (int64, ``runs x span``, or empty to skip that check): the
    last step seen per run and request ``low .. low + span - 1``."""
    n = run.size
    steps = 0
    ascending = last.size > 0
    last[:] = np.iinfo(np.int64).min
    for r in range(n):
        opens = r == 0 or run[r] != run[r - 1] or request[r] != request[r - 1] or step[r] != step[r - 1]
        first[r] = opens
        if opens:
            steps += 1
            if ascending:
                slot = run[r] * span + (request[r] - low)
                if step[r] <= last[slot]:
                    ascending = False
                else:
                    last[slot] = step[r]
        elif position[r] <= position[r - 1]:
            return -1, ascending
    return steps, ascending
