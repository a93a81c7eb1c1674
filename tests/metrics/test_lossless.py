"""Losslessness bias: hand-computed two-token cases and exact zero for rules that ignore the token."""

import numpy as np
import pytest

from svt.metrics.lossless import bias, output_distribution


def test_seed_worked_example():
    p, q = np.array([0.5, 0.5]), np.array([0.2, 0.8])
    np.testing.assert_allclose(output_distribution(p, q, q < 0.5), [0.4, 0.6])
    assert bias(p, q, q < 0.5) == pytest.approx(0.1)


def test_hand_computed_trim_the_likely_token():
    # trim b (q(b)=0.8): a drawn w.p. 0.2 is accepted w.p. min(1, 0.5/0.2) = 1 -> a;
    # b trimmed -> sample from p. p_out(a) = 0.2 + 0.8 * 0.5 = 0.6
    p, q = np.array([0.5, 0.5]), np.array([0.2, 0.8])
    np.testing.assert_allclose(output_distribution(p, q, np.array([False, True])), [0.6, 0.4])


@pytest.mark.parametrize("trim_all", [True, False])
def test_rules_that_do_not_depend_on_the_token_are_exact(trim_all):
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(50), size=200)
    q = rng.dirichlet(np.ones(50) * 0.3, size=200)
    t = np.full(p.shape, trim_all)
    np.testing.assert_allclose(output_distribution(p, q, t), p, atol=1e-12)
    assert bias(p, q, t).max() < 1e-12


def test_batches_match_single_rows_and_token_dependent_rules_are_biased():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(20), size=30)
    q = rng.dirichlet(np.ones(20), size=30)
    t = q < np.median(q, axis=1, keepdims=True)
    batch = output_distribution(p, q, t)
    for i in range(30):
        np.testing.assert_allclose(batch[i], output_distribution(p[i], q[i], t[i]))
        np.testing.assert_allclose(batch[i].sum(), 1.0)
    assert bias(p, q, t).mean() > 1e-3


def test_monte_carlo_agrees_with_the_formula():
    """Simulate trimming + rejection sampling and compare with p_out."""
    rng = np.random.default_rng(2)
    p, q = np.array([0.1, 0.6, 0.3]), np.array([0.5, 0.2, 0.3])
    t = np.array([False, True, False])
    n = 400_000
    x = rng.choice(3, size=n, p=q)
    out = np.empty(n, dtype=int)
    trimmed = t[x]
    out[trimmed] = rng.choice(3, size=trimmed.sum(), p=p)
    acc = rng.random(n) < np.minimum(1, p[x] / q[x])
    keep = ~trimmed & acc
    out[keep] = x[keep]
    rej = ~trimmed & ~acc
    r = np.maximum(p - q, 0) / np.maximum(p - q, 0).sum()
    out[rej] = rng.choice(3, size=rej.sum(), p=r)
    freq = np.bincount(out, minlength=3) / n
    np.testing.assert_allclose(freq, output_distribution(p, q, t), atol=4e-3)
