"""Per-step sums of drafts already in step order, as compiled loops (numba): where each step
opens (checking that positions ascend within it), then each step's accepted drafts, its draft
count and, per probability score, the sum over positions of the running product (the step's
expected accepted length under that score)."""

from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True)
def step_sums(first, accepted, p, out_a, out_k, out_p):
    """``first`` (bool, per row): the row opens a step (rows of a step are contiguous, positions
    ascending); ``accepted`` (uint8): the draft was accepted; ``p`` [scores, rows] (float64).
    Adds into ``out_a``, ``out_k`` (int64, per step) and ``out_p`` [scores, steps] (zeros)."""
    n_scores, n = p.shape
    prod = [1.0] * n_scores
    b = -1
    for r in range(n):
        if first[r]:
            b += 1
            for f in range(n_scores):
                prod[f] = 1.0
        out_a[b] += accepted[r]
        out_k[b] += 1
        for f in range(n_scores):
            prod[f] *= p[f, r]
            out_p[f, b] += prod[f]


@njit(cache=True, nogil=True)
def step_heads(run, request, step, position, first):
    """Mark in ``first`` the rows that open a step (the run, request or step changes from the row
    before); return the number of steps, or -1 when a position does not ascend within a step."""
    n = run.size
    steps = 0
    for r in range(n):
        opens = r == 0 or run[r] != run[r - 1] or request[r] != request[r - 1] or step[r] != step[r - 1]
        first[r] = opens
        if opens:
            steps += 1
        elif position[r] <= position[r - 1]:
            return -1
    return steps
