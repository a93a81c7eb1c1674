"""The online estimator on synthetic drafts from known coefficients."""

import numpy as np
import pytest
from scipy.special import expit
from sklearn.metrics import log_loss

from svt.fit.irls_online import IRLSOnline, OnlineOptions

W_TRUE, B_TRUE = 0.55, np.array([0.6, 0.3, 0.1, -0.1, -0.3])


def synthetic(n_steps, rows_per_step=20, w=W_TRUE, b=B_TRUE, seed=0):
    rng = np.random.default_rng(seed)
    n = n_steps * rows_per_step
    x = rng.normal(0.5, 1.5, n)
    pos = rng.integers(0, len(b), n)
    p = expit(w * x + b[pos])
    y = (rng.random(n) < p).astype(float)
    step = np.repeat(np.arange(n_steps), rows_per_step)
    return x, pos, y, step, p


def test_converges_to_the_true_coefficients_and_the_true_log_loss():
    x, pos, y, step, p_true = synthetic(10_000)
    est = IRLSOnline(OnlineOptions(cycle_steps=50, damping=100)).fit(x, pos, y, step, k=5)
    # each refit is one Newton step from one cycle's 1,000 labels: the path fluctuates around the
    # truth with about that sample's standard error; its average over the second half is tight
    half = np.array([[*e["slope"], *e["intercepts"]] for e in est.path_[len(est.path_) // 2:]])
    assert half[:, 0].mean() == pytest.approx(W_TRUE, abs=0.01)
    np.testing.assert_allclose(half[:, 1:].mean(0), B_TRUE, atol=0.03)
    assert est.slope_[0] == pytest.approx(W_TRUE, abs=0.1)
    late = step >= 5_000  # prequential log-loss of the second half vs the true model's
    gap = log_loss(y[late], est.prequential_[late]) - log_loss(y[late], p_true[late])
    # one-cycle estimates carry about d / (2 n) = 6 / 2000 nats of excess loss
    assert 0 <= gap < 0.005
    gap_start = log_loss(y[late], expit(x[late])) - log_loss(y[late], p_true[late])
    assert gap_start > 10 * gap
    # labels arrive one step late: the last step's join one more refit after the stream ends
    assert len(est.path_) == 10_000 // 50 + 1
    # the start is "q_max as is": w = 1, b = 0 before the first update
    np.testing.assert_allclose(est.prequential_[:20], expit(x[:20]))


def test_re_adapts_after_a_workload_switch():
    x1, pos1, y1, s1, _ = synthetic(3_000, seed=1)
    b2 = B_TRUE - 1.0
    x2, pos2, y2, s2, _ = synthetic(3_000, b=b2, seed=2)
    est = IRLSOnline(OnlineOptions(cycle_steps=200, damping=100)).fit(
        np.r_[x1, x2], np.r_[pos1, pos2], np.r_[y1, y2], np.r_[s1, s2 + 3_000], k=5)
    switch = 3_000 // 200
    b_path = np.array([e["intercepts"] for e in est.path_])
    # averages over 4 cycles of 4,000 labels (one cycle's refit is noisy)
    before = b_path[switch - 4 : switch].mean(0)
    after = b_path[switch + 2 : switch + 6].mean(0)
    np.testing.assert_allclose(before, B_TRUE, atol=0.12)  # tracking the old workload
    np.testing.assert_allclose(after, b2, atol=0.12)  # within a few cycles: on the new one


def test_damping_scales_each_coefficient_by_its_label_count():
    """One cycle: position 0 has 2000 labels, position 4 has 20; with damping c the step of each
    intercept is n / (n + c) times the undamped Newton step."""
    rng = np.random.default_rng(3)
    pos = np.r_[np.zeros(2000, int), np.full(20, 4), np.ones(300, int), np.full(300, 2), np.full(300, 3)]
    x = rng.normal(0, 1, pos.size)
    y = (rng.random(pos.size) < 0.7).astype(float)
    step = np.zeros(pos.size, int)
    free = IRLSOnline(OnlineOptions(cycle_steps=1, damping=0.0)).fit(x, pos, y, step, k=5)
    damped = IRLSOnline(OnlineOptions(cycle_steps=1, damping=200.0)).fit(x, pos, y, step, k=5)
    n = np.bincount(pos)
    np.testing.assert_allclose(damped.intercepts_, free.intercepts_ * n / (n + 200.0), rtol=1e-10)
    assert abs(damped.intercepts_[4]) / abs(free.intercepts_[4]) < 0.1  # few labels: moves little
    assert abs(damped.intercepts_[0]) / abs(free.intercepts_[0]) > 0.9
    n_all = pos.size
    assert damped.slope_[0] - 1 == pytest.approx((free.slope_[0] - 1) * n_all / (n_all + 200.0), rel=1e-10)


def test_per_position_slopes_and_the_vllm_rules():
    x, pos, y, step, _ = synthetic(6_000, seed=4)
    est = IRLSOnline(OnlineOptions(cycle_steps=200, damping=100, per_position_slope=True)).fit(x, pos, y, step, k=5)
    half = np.array([e["slope"] for e in est.path_[len(est.path_) // 2:]])
    np.testing.assert_allclose(half.mean(0), W_TRUE, atol=0.03)
    # min_obs: a position never seen often enough keeps its initial coefficients
    few = IRLSOnline(OnlineOptions(cycle_steps=1, min_obs=10_000, init_intercept=1.5)).fit(x, pos, y, step, k=5)
    np.testing.assert_allclose(few.intercepts_, 1.5)


def test_prequential_predictions_for_any_row_use_the_coefficients_in_force():
    x, pos, y, step, _ = synthetic(500, seed=5)
    est = IRLSOnline(OnlineOptions(cycle_steps=25)).fit(x, pos, y, step, k=5)
    np.testing.assert_allclose(est.predict_prequential(x, pos, step), est.prequential_, rtol=1e-12)
    with pytest.raises(ValueError, match="replay order"):
        IRLSOnline().fit(x, pos, y, step[::-1])


def _one_cycle_reference(x, pos, y, k, ridge):
    """One Newton step from (w, b) = (1, 0) on the full (K + 1) system, solved by numpy."""
    X = np.column_stack([x, np.eye(k)[pos]])
    p = expit(X @ np.r_[1.0, np.zeros(k)])
    g = X.T @ (p - y)
    H = (X * (p * (1 - p))[:, None]).T @ X
    d = np.linalg.solve(H + ridge * np.eye(k + 1), -g)
    return 1.0 + d[0], d[1:]


def test_one_cycle_is_the_full_newton_step():
    x, pos, y, _, _ = synthetic(50, seed=6)
    step = np.zeros(x.size, int)
    est = IRLSOnline(OnlineOptions(cycle_steps=1, damping=0.0, ridge=1e-3)).fit(x, pos, y, step, k=5)
    w, b = _one_cycle_reference(x, pos, y, 5, 1e-3)
    assert est.slope_[0] == pytest.approx(w, rel=1e-10)
    np.testing.assert_allclose(est.intercepts_, b, rtol=1e-9, atol=1e-12)


def test_negative_slope_refits_are_discarded_only_when_asked():
    x, pos, y, step, _ = synthetic(200, w=-1.0, seed=7)  # labels fall with the feature
    o = dict(cycle_steps=50, damping=100.0, init_slope=0.0)
    free = IRLSOnline(OnlineOptions(**o)).fit(x, pos, y, step, k=5)
    assert -1.3 < free.slope_[0] < -0.7
    kept = IRLSOnline(OnlineOptions(**o, reject_negative_slope=True)).fit(x, pos, y, step, k=5)
    assert kept.slope_[0] == 0.0 and (kept.intercepts_ == 0.0).all()  # every refit discarded whole
    pp = IRLSOnline(OnlineOptions(**o, per_position_slope=True, reject_negative_slope=True)).fit(x, pos, y, step, k=5)
    assert (pp.slope_ == 0.0).all()
    assert (IRLSOnline(OnlineOptions(**o, per_position_slope=True)).fit(x, pos, y, step, k=5).slope_ < 0).all()


def test_min_obs_is_per_position():
    """One cycle: position 0 has 400 labels, position 4 has 5; with min_obs 50 only position 4
    keeps its intercept, the others take the full Newton step's values for them."""
    rng = np.random.default_rng(8)
    pos = np.r_[np.zeros(400, int), np.full(5, 4), np.ones(100, int), np.full(100, 2), np.full(100, 3)]
    x = rng.normal(0, 1, pos.size)
    y = (rng.random(pos.size) < 0.7).astype(float)
    step = np.zeros(pos.size, int)
    free = IRLSOnline(OnlineOptions(cycle_steps=1, damping=0.0)).fit(x, pos, y, step, k=5)
    gated = IRLSOnline(OnlineOptions(cycle_steps=1, damping=0.0, min_obs=50)).fit(x, pos, y, step, k=5)
    assert gated.intercepts_[4] == 0.0 and free.intercepts_[4] != 0.0
    np.testing.assert_allclose(gated.intercepts_[:4], free.intercepts_[:4], rtol=1e-12)
    pp = IRLSOnline(OnlineOptions(cycle_steps=1, damping=0.0, min_obs=50, per_position_slope=True)).fit(
        x, pos, y, step, k=5)
    assert pp.intercepts_[4] == 0.0 and pp.slope_[4] == 1.0 and pp.intercepts_[0] != 0.0


def test_label_delay_moves_a_steps_labels_to_the_next_refit():
    """With delay 1 the refit at the end of a cycle lacks its last step's labels: they join the next
    refit. Delay 0 is the same replay with labels available within their own step."""
    x, pos, y, step, _ = synthetic(40, seed=9)
    now = IRLSOnline(OnlineOptions(cycle_steps=10, damping=0.0, label_delay=0)).fit(x, pos, y, step, k=5)
    late = IRLSOnline(OnlineOptions(cycle_steps=10, damping=0.0, label_delay=1)).fit(x, pos, y, step, k=5)
    assert [e["rows"] for e in now.path_] == [200] * 4
    assert [e["rows"] for e in late.path_] == [180, 200, 200, 200, 20]
    # the first refit of the delayed replay is a Newton step on steps 0..8 alone
    first = step < 9
    ref = IRLSOnline(OnlineOptions(cycle_steps=10, damping=0.0, label_delay=0)).fit(
        x[first], pos[first], y[first], np.zeros(first.sum(), int), k=5)
    assert late.path_[0]["slope"] == pytest.approx(ref.path_[0]["slope"], rel=1e-12)
    # scoring is unchanged until the first refit: the first cycle's drafts use the initial state
    np.testing.assert_allclose(late.prequential_[:200], now.prequential_[:200])


def test_library_options_are_not_silently_ignored(small_run):
    """fit_runs(..., per_position_slope=True) / feature= reach the online estimator (they did not)."""
    from svt.fit import OnlineOptions, fit_runs

    shared = fit_runs([small_run], "irls-online")
    per = fit_runs([small_run], "irls-online", per_position_slope=True)
    assert isinstance(shared.to_dict()["slope"], float) and isinstance(per.to_dict()["slope"], list)
    assert per.options.per_position_slope is True
    opts = OnlineOptions(cycle_steps=5)
    f = fit_runs([small_run], "irls-online", online=opts, feature="logit_margin")
    assert f.feature == "logit_margin" and f.options.cycle_steps == 5
    assert opts.feature == "logit_qmax"  # the caller's options object is left as it was
