"""Mergeable summaries against the single-machine definitions: any split of the drafts into shards
gives the same counts and, after the refining pass, AUCs equal to scikit-learn's (ties, float32 and
float64 scores, negative scores, -0.0); the first pass's error stays within the bound it prints;
float sums agree to rounding."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import log_loss, roc_auc_score

from svt.distributed.summaries import (
    ALL,
    EXCLUDING_FIRST,
    auc_bound,
    bins_to_refine,
    ece_mass,
    exact_auc,
    float_keys,
    group_hist,
    in_group,
    key_values,
    mass_bins_to_refine,
    merge_refined,
    refine_counts,
    summarize,
)
from svt.metrics.calibration import brier, ece


def _shards(rng, n, k, kind):
    if kind == "ties":
        s = np.round(rng.beta(2, 1, n), 2)
    elif kind == "float32":
        s = rng.beta(2, 1, n).astype(np.float32).astype(np.float64)
    elif kind == "close":  # distinct float64 values one ulp apart: one high bin, many keys
        s = 0.7 + np.arange(n) * np.spacing(0.7) * rng.integers(0, 3, n)
    else:  # logits, negative and positive, with -0.0 and +0.0
        s = rng.normal(0, 2, n)
        s[:5] = -0.0
        s[5:10] = 0.0
    p = 1 / (1 + np.exp(-s)) if kind in ("logits", "close") else s
    y = (rng.uniform(size=n) < np.clip(p, 0, 1)).astype(np.int64)
    pos = rng.integers(0, k, n)
    cut = np.sort(rng.integers(0, n, 3))
    return s, y, pos, np.split(np.arange(n), cut)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), kind=st.sampled_from(["ties", "float32", "close", "logits"]))
def test_two_passes_give_the_exact_auc_whatever_the_shards(seed, kind):
    rng = np.random.default_rng(seed)
    k = 3
    s, y, pos, parts = _shards(rng, 600, k, kind)
    prob = kind in ("ties", "float32")
    summaries = [summarize(s[i], y[i], pos[i], k, prob) for i in parts]
    total = summaries[0]
    for other in summaries[1:]:
        total = total + other
    assert total.n.tolist() == np.bincount(pos, minlength=k).tolist()
    for g in (ALL, EXCLUDING_FIRST, 0, 1, 2):
        m = in_group(pos, g)
        if len(set(y[m])) < 2:
            continue
        ref = roc_auc_score(y[m], s[m])
        h = group_hist(total.hist, g)
        coarse, bound = auc_bound(h)
        assert abs(coarse - ref) <= bound + 1e-12  # the first pass's error is within its bound
        sel = {g: bins_to_refine(h)}
        refined = merge_refined([refine_counts(s[i], y[i], pos[i], sel) for i in parts])
        auc, left = exact_auc(h, refined.get(g))
        assert left == 0.0 and auc == pytest.approx(ref, abs=1e-12)


def test_float_sums_agree_with_the_single_machine_definitions():
    rng = np.random.default_rng(0)
    s, y, pos, parts = _shards(rng, 5000, 4, "float32")
    total = summarize(s[parts[0]], y[parts[0]], pos[parts[0]], 4, True)
    for i in parts[1:]:
        total = total + summarize(s[i], y[i], pos[i], 4, True)
    n = total.n.sum()
    assert total.log_loss.sum() / n == pytest.approx(log_loss(y, s), rel=1e-12)
    assert total.brier.sum() / n == pytest.approx(brier(y, s), rel=1e-12)
    e = total.ece.sum(0)
    filled = e[:, 0] > 0
    got = np.sum(e[filled, 0] * np.abs(e[filled, 1] / e[filled, 0] - e[filled, 2] / e[filled, 0])) / e[:, 0].sum()
    assert got == pytest.approx(ece(y, s, n_bins=10), rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), kind=st.sampled_from(["ties", "float32", "close"]), n=st.sampled_from([7, 600, 1000]))
def test_equal_mass_ece_is_the_single_machines_whatever_the_shards(seed, kind, n):
    """The bins are the single machine's (a tie group's bin set by the drafts below it, tied scores
    in one bin, its float arithmetic at the boundaries); the bins straddling a boundary are read
    key by key in the second pass; n = 1000 puts boundaries at exact multiples."""
    rng = np.random.default_rng(seed)
    k = 3
    s, y, pos, parts = _shards(rng, n, k, kind)
    s = np.clip(s, 0, 1)
    total = summarize(s[parts[0]], y[parts[0]], pos[parts[0]], k, True)
    for i in parts[1:]:
        total = total + summarize(s[i], y[i], pos[i], k, True)
    for g in (ALL, EXCLUDING_FIRST, 0, 1, 2):
        m = in_group(pos, g)
        if not m.any():
            continue
        h = group_hist(total.hist, g)
        refined = merge_refined([refine_counts(s[i], y[i], pos[i], {g: mass_bins_to_refine(h)}) for i in parts])
        assert ece_mass(h, refined.get(g)) == pytest.approx(ece(y[m], s[m], n_bins=10, strategy="mass"),
                                                            abs=1e-12)  # a difference of sums: to 1e-12 of them


def test_a_straddling_bin_left_unread_is_an_error_not_a_number():
    rng = np.random.default_rng(3)
    s, y, pos, _ = _shards(rng, 2000, 1, "close")
    h = summarize(s, y, pos, 1, True).hist[0]
    assert mass_bins_to_refine(h).size  # one ulp apart: every boundary inside one bin
    with pytest.raises(ValueError, match="straddling"):
        ece_mass(h, None)


def test_key_values_invert_the_keys():
    x = np.array([-np.inf, -2.5, -1e-300, 0.0, 1e-300, 0.5, 0.5000000000000001, np.inf])
    assert key_values(float_keys(x)).tolist() == x.tolist()


def test_the_key_orders_floats_and_merges_the_zeros():
    x = np.array([-np.inf, -2.5, -1e-300, -0.0, 0.0, 1e-300, 0.5, 0.5000000000000001, np.inf])
    k = float_keys(x)
    assert (np.diff(k.astype(object)) >= 0).all() and k[3] == k[4] and len(set(k.tolist())) == x.size - 1


def test_a_tolerance_leaves_a_bound_and_zero_refines_everything():
    rng = np.random.default_rng(1)
    s, y, pos, parts = _shards(rng, 3000, 1, "close")
    h = group_hist([summarize(s, y, pos, 1, False).hist[0]], 0)
    coarse, bound = auc_bound(h)
    assert bound > 0  # the close scores share bins
    loose = bins_to_refine(h, tol=1.0)
    assert loose.size == 0 and exact_auc(h, None)[1] == pytest.approx(bound)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), kind=st.sampled_from(["ties", "float32", "close"]))
def test_soft_label_blocks_merge_to_the_single_machines(seed, kind):
    """A soft label's block from shards cut anywhere: the sums and both ECEs equal the single
    machine's (svt.metrics.ordered.score_tables) to rounding, its AUC within the bound printed."""
    from svt.distributed.summaries import (
        merge_soft_refined,
        refine_soft,
        soft_block,
        soft_mass_bins,
        summarize_soft,
    )
    from svt.metrics.ordered import score_tables

    rng = np.random.default_rng(seed)
    s, y, pos, parts = _shards(rng, 800, 2, kind)
    s = np.clip(s, 0, 1)
    soft = np.clip(s + rng.normal(0, 0.2, s.size), 0, 1)
    ref = score_tables(s, y, pos, probability=True, soft={"p": soft})["soft"]["p"]
    total = summarize_soft(s[parts[0]], soft[parts[0]], True)
    for i in parts[1:]:
        total = total + summarize_soft(s[i], soft[i], True)
    bins = soft_mass_bins(total.hist)
    got = soft_block(total, merge_soft_refined([refine_soft(s[i], soft[i], bins) for i in parts]))
    assert got["n"] == ref["n"] and got["accept_rate"] == pytest.approx(ref["accept_rate"], rel=1e-12)
    assert abs(got["auc"] - ref["auc"]) <= got["auc_bound"] + 1e-12
    for m in ("log_loss", "brier", "mean_pred"):
        assert got[m] == pytest.approx(ref[m], rel=1e-12, abs=1e-15), m
    for m in ("ece", "ece_mass"):  # a difference of two sums that nearly cancel: to 1e-12 of the sums
        assert got[m] == pytest.approx(ref[m], abs=1e-12), m
    if kind == "ties":  # two decimals: one key a bin, so the bin's pairs are ties and the AUC is exact
        assert got["auc"] == pytest.approx(ref["auc"], abs=1e-12)
