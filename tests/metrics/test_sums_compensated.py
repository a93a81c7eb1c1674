"""The compiled unordered pass sums log-loss, Brier and the mean score with compensation: over
millions of rows they equal the exactly rounded sums (``math.fsum``) to a few units in the last
place, where a running total drifts by about a thousand (the cluster's pairwise sums agree with
the exactly rounded ones too, so the two paths agree to 1e-15, not 1e-11)."""

import math

import numpy as np
import pytest

from svt.metrics.ordered import score_tables


def test_the_sums_are_the_exactly_rounded_ones():
    rng = np.random.default_rng(0)
    n = 4_000_000
    s = np.sort(rng.random(n).astype(np.float32).astype(np.float64))[::-1].copy()  # large terms first: hard
    y = (rng.random(n) < s).astype(np.int8)
    pos = np.zeros(n, dtype=np.int16)
    got = score_tables(s, y, pos, probability=True)["overall"]
    eps = np.finfo(np.float64).eps
    c = np.clip(s, eps, 1 - eps)
    ll = -(y * np.log(c) + (1 - y) * np.log1p(-c))
    for name, terms in (("log_loss", ll), ("brier", (s - y) ** 2)):
        exact = math.fsum(terms.tolist()) / n
        naive = float(np.cumsum(terms)[-1]) / n  # a running total, row by row
        assert got[name] == pytest.approx(exact, rel=4 * eps, abs=0), name
        assert abs(naive - exact) > 100 * eps * exact, "the data must be hard enough for a running total"
