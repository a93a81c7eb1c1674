"""The radix sort of keys ``rank << 32 | row`` against numpy's sort of the same keys."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svt.metrics.ordered import _float32_keys, order_keys
from svt.metrics.radix_kernel import radix_sort_high


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


def test_order_keys_beyond_large_use_numpy_in_place(monkeypatch):
    from svt.metrics import ordered

    s = np.random.default_rng(1).random(10_000)
    monkeypatch.setattr(ordered, "LARGE", 1000)  # beyond LARGE: the in-place path
    a = order_keys(s)
    monkeypatch.setattr(ordered, "LARGE", 1 << 25)
    np.testing.assert_array_equal(a, order_keys(s))
