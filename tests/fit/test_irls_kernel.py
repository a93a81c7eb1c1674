"""The compiled replay of the online estimator (`svt.fit.irls_kernel`) against the numpy
implementation: every option, label delays, gaps between steps, and one-row cycles."""

import numpy as np
import pytest

from svt.fit import IRLSOnline, OnlineOptions
from svt.fit.irls_online import PRESETS

CASES = {
    "source": OnlineOptions(),
    "vllm": PRESETS["vllm"],
    "per-position, min_obs, no negative slope": OnlineOptions(per_position_slope=True, min_obs=30,
                                                              reject_negative_slope=True),
    "no damping, no delay, big ridge": OnlineOptions(damping=0.0, label_delay=0, ridge=0.5),
    "long delay, short cycles": OnlineOptions(cycle_steps=1, label_delay=7, init_slope=0.3, init_intercept=-1.0),
    "shared slope, min_obs": OnlineOptions(min_obs=40, reject_negative_slope=True, init_slope=-0.5),
}


def _stream(seed, n=30_000, k=5, slope=1.3):
    rng = np.random.default_rng(seed)
    pos = rng.integers(0, k, n)
    x = rng.normal(size=n)
    step = np.sort(rng.integers(0, n // 3, n)) * 3  # gaps: some cycles have no rows
    y = (rng.random(n) < 1 / (1 + np.exp(-(slope * x + 0.4 * pos - 0.8)))).astype(np.float64)
    return x, pos, y, step, k


@pytest.mark.parametrize("name", list(CASES))
def test_compiled_replay_equals_numpy(name):
    x, pos, y, step, k = _stream(sum(map(ord, name)))
    a = IRLSOnline(CASES[name]).fit(x, pos, y, step, k=k)
    b = IRLSOnline(CASES[name]).fit(x, pos, y, step, k=k, compiled=False)
    np.testing.assert_allclose(a.prequential_, b.prequential_, rtol=0, atol=1e-10)
    np.testing.assert_allclose(a.intercepts_, b.intercepts_, rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.slope_, b.slope_, rtol=0, atol=1e-9)
    assert [e["cycle"] for e in a.path_] == [e["cycle"] for e in b.path_]
    assert [e["rows"] for e in a.path_] == [e["rows"] for e in b.path_]
    np.testing.assert_allclose(np.array([e["intercepts"] for e in a.path_]),
                               np.array([e["intercepts"] for e in b.path_]), atol=1e-9)
    cycles = np.arange(0, step.max() // CASES[name].cycle_steps + 2)
    for u, v in zip(a.coefficients_at(cycles), b.coefficients_at(cycles), strict=True):
        np.testing.assert_allclose(u, v, atol=1e-9)


def test_read_only_and_narrow_inputs_give_the_same_fit():
    """Polars hands out read-only arrays and int16 positions; the replay copies them."""
    x, pos, y, step, k = _stream(7)
    a = IRLSOnline().fit(x, pos, y, step, k=k)
    xr, pr = x.copy(), pos.astype(np.int16)
    xr.flags.writeable = False
    b = IRLSOnline().fit(xr, pr, y.astype(np.int8), step.astype(np.int32), k=k)
    assert np.array_equal(a.prequential_, b.prequential_)


def test_one_row_is_scored_with_the_initial_coefficients():
    est = IRLSOnline(OnlineOptions(init_slope=2.0, init_intercept=0.5)).fit(
        np.array([0.25]), np.array([0]), np.array([1.0]), np.array([0]), k=1)
    assert est.prequential_[0] == pytest.approx(1 / (1 + np.exp(-(2.0 * 0.25 + 0.5))), abs=1e-15)
    assert len(est.path_) == 1


def test_a_singular_per_position_system_keeps_the_coefficients_in_both_paths():
    """ridge 0 and a feature constant at a position within a cycle: det = 0, the step is NaN and
    the position keeps its coefficients (numpy's arithmetic, not a ZeroDivisionError)."""
    o = OnlineOptions(ridge=0.0, per_position_slope=True, damping=0.0)
    x = np.array([0.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.3, 0.9])
    pos = np.array([0, 0, 1, 1, 0, 0, 1, 1])
    y = np.array([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    step = np.array([0, 0, 0, 0, 10, 10, 10, 10])
    a = IRLSOnline(o).fit(x, pos, y, step, k=2)
    b = IRLSOnline(o).fit(x, pos, y, step, k=2, compiled=False)
    np.testing.assert_array_equal(a.slope_, b.slope_)
    np.testing.assert_array_equal(a.intercepts_, b.intercepts_)
    assert a.slope_[0] == 1.0 and a.intercepts_[0] == 0.0  # position 0 kept its initial values


@pytest.mark.parametrize("per_position", [False, True])
@pytest.mark.parametrize("compiled", [True, False])
def test_negative_slopes_are_rejected_when_asked(per_position, compiled):
    """Labels that fall with the feature: refits want a negative slope. With the rule no refit
    leaves one; without it some do. (Near a slope of 0 the rule's decisions can flip on rounding,
    so the two implementations are compared on the rule, not row by row.)"""
    x, pos, y, step, k = _stream(5, slope=-1.3)

    def slopes(reject):
        o = OnlineOptions(reject_negative_slope=reject, per_position_slope=per_position)
        est = IRLSOnline(o).fit(x, pos, y, step, k=k, compiled=compiled)
        return np.array([np.atleast_1d(e["slope"]) for e in est.path_])

    assert (slopes(True) >= 0).all()
    assert (slopes(False) < 0).any()
