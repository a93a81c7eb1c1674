"""Losslessness bias of a trimming rule.

A rule "do not verify a draft of token x when trimmed(x)" changes what speculative sampling emits:

    p_out(y) = sum_x q(x) [trimmed(x)] p(y)
             + sum_x q(x) [kept(x)] (min(1, p(x)/q(x)) [y = x] + (1 - min(1, p(x)/q(x))) r(y)),

with r = norm(max(0, p - q)) (a trimmed draft falls back to sampling from p). The bias is the total
variation distance between p_out and p: zero whenever the rule does not depend on x.

>>> import numpy as np
>>> p, q = np.array([0.5, 0.5]), np.array([0.2, 0.8])
>>> output_distribution(p, q, q < 0.5)   # the seed's worked example
array([0.4, 0.6])
>>> round(float(bias(p, q, q < 0.5)), 12)
0.1
"""

from __future__ import annotations

import numpy as np


def _check(p, q, trimmed):
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    t = np.asarray(trimmed, dtype=bool)
    if p.shape != q.shape or t.shape != q.shape:
        raise ValueError(f"Expected p, q and trimmed of one shape, but got {p.shape}, {q.shape}, {t.shape}.")
    for name, a in (("p", p), ("q", q)):
        if (a < 0).any() or not np.allclose(a.sum(-1), 1.0, atol=1e-6):
            raise ValueError(f"Expected `{name}` to be distributions over the last axis (>= 0, summing to 1).")
    return p, q, t


def output_distribution(p, q, trimmed) -> np.ndarray:
    """p_out for one or a batch of positions (numpy arrays, last axis = vocabulary)."""
    p, q, t = _check(p, q, trimmed)
    with np.errstate(divide="ignore", invalid="ignore"):
        accept = np.where(q > 0, np.minimum(1.0, p / q), 1.0)
    resid = np.maximum(p - q, 0.0)
    mass = resid.sum(-1, keepdims=True)
    r = np.where(mass > 0, resid / np.where(mass > 0, mass, 1.0), p)
    kept = q * ~t
    trimmed_mass = (q * t).sum(-1, keepdims=True)
    reject_mass = (kept * (1 - accept)).sum(-1, keepdims=True)
    p_out = trimmed_mass * p + kept * accept + reject_mass * r
    # A rule that trims every token or none is exactly p (the rejection-sampling identity); return
    # p itself there rather than p plus round-off, so lossless rules audit to exactly 0.
    constant = (t.all(-1) | (~t).all(-1))[..., None]
    return np.where(constant, p, p_out)


def bias(p, q, trimmed) -> np.ndarray | float:
    """Total-variation distance between p_out and p (per position for a batch)."""
    p_out = output_distribution(p, q, trimmed)
    return 0.5 * np.abs(p_out - np.asarray(p, dtype=np.float64)).sum(-1)
