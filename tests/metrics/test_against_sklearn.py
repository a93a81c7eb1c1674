"""The metrics agree with scikit-learn to 1e-9, including ties, tiny inputs and imbalance."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import brier_score_loss, roc_auc_score
from sklearn.metrics import log_loss as sk_log_loss

from svt.metrics import auc_reason, brier, calibration_bins, ece, log_loss, roc_auc


@st.composite
def labelled_scores(draw, tied=False):
    n = draw(st.integers(2, 60))
    y = np.array(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)))
    if y.min() == y.max():  # both classes (AUC's domain); one class is tested separately
        y[draw(st.integers(0, n - 1))] = 1 - y[0]
    if tied:  # few distinct values: many ties
        s = np.array(draw(st.lists(st.sampled_from([0.1, 0.25, 0.5, 0.75, 0.9]), min_size=n, max_size=n)))
    else:
        s = np.array(draw(st.lists(st.floats(0.001, 0.999), min_size=n, max_size=n)))
    w = np.array(draw(st.lists(st.floats(0.1, 5.0), min_size=n, max_size=n)))
    return y, s, w


@settings(max_examples=150, deadline=None)
@given(labelled_scores(), st.booleans())
def test_auc_matches_sklearn(data, weighted):
    y, s, w = data
    sw = w if weighted else None
    assert roc_auc(y, s, sample_weight=sw) == pytest.approx(roc_auc_score(y, s, sample_weight=sw), abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(labelled_scores(tied=True))
def test_auc_ties_count_half(data):
    y, s, _ = data
    assert roc_auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(labelled_scores(), st.booleans())
def test_log_loss_and_brier_match_sklearn(data, weighted):
    y, s, w = data
    sw = w if weighted else None
    assert log_loss(y, s, sample_weight=sw) == pytest.approx(sk_log_loss(y, s, sample_weight=sw), abs=1e-9)
    assert brier(y, s, sample_weight=sw) == pytest.approx(brier_score_loss(y, s, sample_weight=sw), abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(labelled_scores())
def test_auc_invariant_to_monotone_transforms_and_flips_under_negation(data):
    y, s, _ = data
    s = np.round(s, 6)  # floats closer than that may collapse under the transform
    a = roc_auc(y, s)
    assert roc_auc(y, np.log(s / (1 - s))) == pytest.approx(a, abs=1e-12)
    assert roc_auc(y, -s) == pytest.approx(1 - a, abs=1e-12)


def test_imbalanced_large_input():
    rng = np.random.default_rng(0)
    y = (rng.random(200_000) < 0.02).astype(int)
    s = np.clip(rng.normal(0.3 + 0.2 * y, 0.15), 0, 1).round(3)  # rounding: many ties
    assert roc_auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-9)
    assert log_loss(y, s) == pytest.approx(sk_log_loss(y, s), abs=1e-9)


def _slow_soft_auc(t, s):
    """Every ordered pair of distinct rows: i's positive weight against j's negative weight."""
    num = den = 0.0
    for i in range(t.size):
        for j in range(t.size):
            if i != j:
                w = t[i] * (1 - t[j])
                den += w
                num += w * (1.0 if s[i] > s[j] else 0.5 if s[i] == s[j] else 0.0)
    return num / den


def test_soft_labels_are_weighted_hard_labels():
    """A soft label t counts as a positive with weight t and a negative with weight 1 - t; AUC counts
    pairs of distinct rows only."""
    rng = np.random.default_rng(1)
    t, s = rng.random(120), rng.random(120).round(1)  # rounding: ties across rows
    yy = np.r_[np.ones(120), np.zeros(120)]
    ww = np.r_[t, 1 - t]
    ss = np.r_[s, s]
    assert roc_auc(t, s) == pytest.approx(_slow_soft_auc(t, s), abs=1e-12)
    # scikit-learn on duplicated rows also pairs each row with itself (a tie): remove those pairs
    self_pairs = np.sum(t * (1 - t))
    sk = roc_auc_score(yy, ss, sample_weight=ww) * (t.sum() * (1 - t).sum())
    assert roc_auc(t, s) == pytest.approx((sk - 0.5 * self_pairs) / (t.sum() * (1 - t).sum() - self_pairs), abs=1e-9)
    assert log_loss(t, s) == pytest.approx(sk_log_loss(yy, ss, sample_weight=ww), abs=1e-9)


def test_one_class_is_undefined_with_a_reason():
    assert np.isnan(roc_auc([1, 1, 1], [0.1, 0.2, 0.3]))
    assert auc_reason([1, 1, 1]) == "only one class (all 3 labelled drafts accepted)"
    assert auc_reason([0, 0]) == "only one class (all 2 labelled drafts rejected)"
    assert auc_reason([]) == "no labelled drafts"
    assert auc_reason([0, 1]) is None


def test_ece_against_a_slow_reference():
    rng = np.random.default_rng(2)
    p = rng.random(1000)
    y = (rng.random(1000) < p ** 1.5).astype(float)
    ref = 0.0
    for b in range(10):
        m = (p >= b / 10) & ((p < (b + 1) / 10) | (b == 9))
        if m.any():
            ref += m.sum() / 1000 * abs(p[m].mean() - y[m].mean())
    assert ece(y, p) == pytest.approx(ref, abs=1e-12)
    mass = calibration_bins(y, p, strategy="mass")
    assert (mass["count"] == 100).all()  # distinct predictions: equal counts
    perfectly = (rng.random(200_000) < (q := rng.random(200_000))).astype(float)
    assert ece(perfectly, q) < 0.01


@pytest.mark.parametrize("bad, msg", [
    (([0, 1], [0.5]), "one length"),
    (([0, 1], [0.5, np.nan]), "finite"),
    (([0, 2], [0.5, 0.5]), "in \\[0, 1\\]"),
])
def test_bad_input_is_named(bad, msg):
    with pytest.raises(ValueError, match=msg):
        roc_auc(*bad)
    with pytest.raises(ValueError, match="probabilities"):
        log_loss([0, 1], [0.5, 1.5])


def test_equal_mass_bins_keep_ties_together_and_ignore_order_within_ties():
    rng = np.random.default_rng(3)
    p = rng.choice([0.1, 0.3, 0.35, 0.6, 0.9], size=500)
    y = (rng.random(500) < p).astype(float)
    b = calibration_bins(y, p, strategy="mass", n_bins=4)
    assert b["count"].sum() == 500
    perm = rng.permutation(500)
    assert ece(y[perm], p[perm], strategy="mass") == pytest.approx(ece(y, p, strategy="mass"), abs=1e-15)
    from svt.metrics.calibration import mass_bin_index
    idx = mass_bin_index(np.sort(p), None, 500.0, 4)
    for v in np.unique(p):
        assert len(set(idx[np.sort(p) == v])) == 1
