"""The radix sorts of keys ``rank << 32 | row`` (the stable one of the ranks, the in-place one of
the whole keys) against numpy's sort of the same keys, and the compiled keys against numpy's."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svt.metrics import ordered
from svt.metrics.ordered import _float32_keys, order_keys
from svt.metrics.radix_kernel import msd_sort_segments, radix_sort_high, sort_in_place


def _keys(s: np.ndarray) -> np.ndarray:
    key = np.empty(s.size, dtype=np.uint64)
    _float32_keys(s, key)
    return key


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e30, 1e30, allow_nan=False), max_size=3000))
def test_radix_sort_is_numpy_sort(values):
    key = _keys(np.asarray(values, dtype=np.float64))
    np.testing.assert_array_equal(radix_sort_high(key.copy()), np.sort(key))


@pytest.mark.parametrize("make", [
    lambda r: r.random(200_000),  # probabilities: the top byte mostly constant (a pass skipped)
    lambda r: np.round(r.random(200_000), 2),  # many ties: rows ascending within each
    lambda r: np.full(50_000, 0.25),  # one rank: every pass skipped
    lambda r: -r.standard_exponential(100_000) * 1e6,  # negative scores across exponents
])
def test_radix_sort_cases(make):
    s = make(np.random.default_rng(0))
    key = _keys(s)
    got = radix_sort_high(key.copy())
    np.testing.assert_array_equal(got, np.sort(key))
    rows = (got & np.uint64(0xFFFFFFFF)).astype(np.int64)
    assert (np.diff(s.astype(np.float32)[rows]) >= 0).all()  # ascending float32 ranks


def test_order_keys_beyond_large_sort_in_place(monkeypatch):
    s = np.random.default_rng(1).random(10_000)
    monkeypatch.setattr(ordered, "LARGE", 1000)  # beyond LARGE: the in-place path
    a = order_keys(s)
    monkeypatch.setattr(ordered, "LARGE", 1 << 25)
    np.testing.assert_array_equal(a, order_keys(s))


_CASES = [
    lambda r: r.beta(5, 1, 300_000),  # probabilities near 1: the top bits shared
    lambda r: np.round(r.random(300_000), 3),  # long ties: the rows decide
    lambda r: np.full(100_000, 0.25),  # one rank: already in order
    lambda r: -r.standard_exponential(200_000) * 1e6,  # negative scores across exponents
    lambda r: r.permutation(np.r_[np.zeros(150_000), np.ones(30), r.random(40)]),  # one huge bucket
]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e30, 1e30, allow_nan=False), max_size=3000), st.integers(1, 3))
def test_sort_in_place_is_numpy_sort(values, threads):
    key = _keys(np.asarray(values, dtype=np.float64))
    np.testing.assert_array_equal(sort_in_place(key.copy(), threads), np.sort(key))


@pytest.mark.parametrize("make", _CASES)
def test_sort_in_place_cases(make):
    key = _keys(make(np.random.default_rng(2)))
    got = key.copy()
    assert sort_in_place(got) is got  # no second array
    np.testing.assert_array_equal(got, np.sort(key))


@pytest.mark.parametrize("limit, capacity", [(1000, 4096), (20_000, 3), (300, 1)])
def test_msd_segments_split_then_finish(limit, capacity):
    """Splitting leaves segments of at most ``limit`` keys (adjacent ones joined; once the output
    is full, sorted in place); sorting each then sorts the whole."""
    key = _keys(np.random.default_rng(3).beta(2, 5, 100_000))
    got = key.copy()
    lo, hi = np.empty(capacity, np.int64), np.empty(capacity, np.int64)
    m = msd_sort_segments(got, np.zeros(1, np.int64), np.full(1, got.size, np.int64), limit, lo, hi)
    assert 0 < m <= capacity and ((hi[:m] - lo[:m]) <= limit).all()
    o = np.argsort(lo[:m])
    assert (hi[:m][o][:-1] <= lo[:m][o][1:]).all()  # disjoint
    none = np.zeros(0, np.int64)
    msd_sort_segments(got, lo[:m], hi[:m], 0, none, none)
    np.testing.assert_array_equal(got, np.sort(key))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e30, 1e30, allow_nan=False), st.sampled_from([0.0, -0.0, 1e-40, -1e-45])),
                max_size=5000), st.booleans())
def test_compiled_keys_are_the_numpy_keys(values, single):
    s = np.asarray(values, dtype=np.float32 if single else np.float64)
    got, ref = np.empty(s.size, np.uint64), np.empty(s.size, np.uint64)
    exact = ordered._float32_keys(s, got)
    try:
        ordered.COMPILED = False
        ref_exact = ordered._float32_keys(s, ref)
    finally:
        ordered.COMPILED = True
    np.testing.assert_array_equal(got, ref)
    assert exact == ref_exact
