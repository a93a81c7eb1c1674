"""The cost model a profile fits (issue 54): on synthetic times of known shape and noise it recovers
the shape, stays monotone, and calls itself reliable; a busy machine's signature (a cell slowed in
some repeats) or too few repeats make it say it is not. The profile writes the fitted table, with
the raw medians, residuals and bootstrap intervals beside it."""

import numpy as np
import pytest

from svt.collect.cost_fit import MAX_RESIDUAL, fit_costs, fit_warnings
from svt.simulate.costs import load_costs, write_costs

BATCHES = (1, 2, 4, 8, 16, 32, 64)
K = 5


def true_verify(t):  # a roofline: flat up to a knee, then linear
    return max(2.0, 0.02 * t) + 0.3


def true_draft(b, k):
    return 0.2 + (0.4 + 0.01 * b) * k


def _samples(seed=0, noise=0.03, repeats=7):
    rng = np.random.default_rng(seed)
    draft = {b: np.array([[true_draft(b, k) for k in range(1, K + 1)]] * repeats) * rng.lognormal(0, noise, (repeats, K))
             for b in BATCHES}
    verify = {(b, m): list(true_verify(b * m) * rng.lognormal(0, noise, repeats)) for b in BATCHES
              for m in range(1, K + 2)}
    return draft, verify


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fit_recovers_a_known_shape_and_calls_itself_reliable(seed):
    draft, verify = _samples(seed)
    d, v, rec = fit_costs(draft, verify, seed=seed, bootstrap=100)
    assert max(abs(v[t] / true_verify(t) - 1) for t in v) < 0.03
    assert max(abs(d[b][k] / true_draft(b, k) - 1) for b in BATCHES for k in range(1, K + 1)) < 0.03
    totals = sorted(v)
    assert all(v[a] <= v[b] for a, b in zip(totals, totals[1:], strict=False))  # never cheaper with more tokens
    for k in range(1, K + 1):
        assert all(d[a][k] <= d[b][k] for a, b in zip(BATCHES, BATCHES[1:], strict=False))
    assert all(d[b][k] < d[b][k + 1] for b in BATCHES for k in range(1, K))
    assert rec["max_residual"] <= MAX_RESIDUAL and fit_warnings(rec) == []
    inside = [lo <= true_verify(t) <= hi for t, (lo, hi) in rec["interval95"]["verify"].items()]
    assert np.mean(inside) >= 0.7  # the interval is of the fit, over noisy repeats: it holds the truth mostly


def test_a_busy_machines_signature_and_too_few_repeats_are_flagged():
    draft, verify = _samples()
    verify[(8, 1)] = [x * 2.5 for x in verify[(8, 1)]]  # another process ran through this cell
    rec = fit_costs(draft, verify, bootstrap=10)[2]
    assert rec["max_residual"] > MAX_RESIDUAL and "misses a measured cell" in fit_warnings(rec)[0]
    rec = fit_costs(*_samples(repeats=3), bootstrap=10)[2]
    assert any("3 repeats per cell" in w for w in fit_warnings(rec))


def test_one_noisy_cell_within_the_fit_does_not_flag_the_table():
    """What flagged the demo's own profile: a raw median a little off its neighbours. The fit absorbs
    it (monotone), its residual stays under the limit, and the table is reliable."""
    draft, verify = _samples()
    verify[(4, 2)] = [x * 1.06 for x in verify[(4, 2)]]
    rec = fit_costs(draft, verify, bootstrap=10)[2]
    assert fit_warnings(rec) == []


def test_the_profile_writes_the_fitted_table_with_its_record(tiny_pair, tmp_path, monkeypatch):
    import svt.collect.profile as profile

    quiet = {"load_1min": 0.0, "cores": 2, "threads": 2}
    monkeypatch.setattr(profile, "machine_load", lambda: quiet)
    table = profile.profile_pair(tiny_pair.target, tiny_pair.draft, k=3, batches=(1, 2), context=8, repeats=5)
    fit = table.measurement["fit"]
    assert set(fit) >= {"raw_draft_ms", "raw_verify_ms", "residuals", "interval95", "max_residual", "model"}
    assert set(table.verify_ms) == set(fit["raw_verify_ms"]) and set(table.draft_ms) == {1, 2}
    loaded = load_costs(write_costs(table, tmp_path / "c.yaml"))
    assert loaded.measurement["fit"]["max_residual"] == fit["max_residual"]
    for b, row in table.draft_ms.items():
        assert loaded.draft_ms[b] == pytest.approx({k: round(v, 4) for k, v in row.items()})
