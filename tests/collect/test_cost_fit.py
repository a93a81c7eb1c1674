"""The cost model a profile fits (issue 54): on synthetic times of known shape and noise it recovers
the shape, stays monotone, and calls itself reliable; a busy machine's signature (a cell slowed in
some repeats) or too few repeats make it say it is not. The profile writes the fitted table, with
the raw medians, residuals and bootstrap intervals beside it."""

import numpy as np
import pytest

from svt.collect.cost_fit import MAX_RESIDUAL, bimonotone, fit_costs, fit_warnings
from svt.simulate.cost_files import load_costs, write_costs

BATCHES = (1, 2, 4, 8, 16, 32, 64)
K = 5


def true_verify(b, m):  # a roofline in the tokens (flat up to a knee, then linear), plus a cost per row
    return max(2.0, 0.02 * b * m) + 0.3 + 0.05 * b


def true_draft(b, k):
    return 0.2 + (0.4 + 0.01 * b) * k


def _samples(seed=0, noise=0.03, repeats=7):
    rng = np.random.default_rng(seed)
    draft = {b: np.array([[true_draft(b, k) for k in range(1, K + 1)]] * repeats) * rng.lognormal(0, noise, (repeats, K))
             for b in BATCHES}
    verify = {(b, m): list(true_verify(b, m) * rng.lognormal(0, noise, repeats)) for b in BATCHES
              for m in range(1, K + 2)}
    return draft, verify


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fit_recovers_a_known_shape_and_calls_itself_reliable(seed):
    draft, verify = _samples(seed, repeats=15)  # the profile's repeats: a median within ~1 % (3 % noise)
    d, v, rec = fit_costs(draft, verify, seed=seed, bootstrap=100)
    # 77 cells, each a median off by its noise: the largest within 4 of its standard deviations
    assert max(abs(v[b][m] / true_verify(b, m) - 1) for b in v for m in v[b]) < 0.04
    assert max(abs(d[b][k] / true_draft(b, k) - 1) for b in BATCHES for k in range(1, K + 1)) < 0.04
    grid = np.array([[v[b][m] for m in sorted(v[b])] for b in BATCHES])
    assert (np.diff(grid, axis=0) >= 0).all() and (np.diff(grid, axis=1) >= 0).all()  # more rows or tokens never cheaper
    for k in range(1, K + 1):
        assert all(d[a][k] <= d[b][k] for a, b in zip(BATCHES, BATCHES[1:], strict=False))
    assert all(d[b][k] < d[b][k + 1] for b in BATCHES for k in range(1, K))
    assert rec["max_residual"] <= MAX_RESIDUAL and fit_warnings(rec) == []
    inside = [lo <= true_verify(b, m) <= hi for b, row in rec["interval95"]["verify"].items()
              for m, (lo, hi) in row.items()]
    assert np.mean(inside) >= 0.7  # the interval is of the fit, over noisy repeats: it holds the truth mostly
    assert len(rec["replicates"]) == 40 and set(rec["replicates"][0]) == {"draft_ms", "verify_rows_ms"}


def test_a_model_in_total_tokens_alone_misses_a_cost_per_row():
    """The demo's failure: 64 rows of 1 token cost more than 16 rows of 4. Here each row costs 0.05
    ms on its own; the fit in (rows, tokens a row) describes it, so the table is reliable."""
    draft, verify = _samples(noise=0.01)
    rec = fit_costs(draft, verify, bootstrap=10)[2]
    assert rec["max_residual"] < 0.03
    assert rec["raw_verify_rows_ms"][64][1] > 1.5 * rec["raw_verify_rows_ms"][16][4]


@pytest.mark.parametrize("seed", range(4))
def test_the_bimonotone_fit_is_the_weighted_least_squares_projection(seed):
    """Against a general solver: minimise sum w (z - y)^2 subject to z non-decreasing along both
    axes (SLSQP, scipy), on small noisy grids with unequal weights."""
    from scipy.optimize import minimize

    rng = np.random.default_rng(seed)
    y = rng.normal(0, 1, (4, 3)) + np.add.outer(np.arange(4), np.arange(3)) * 0.3
    w = rng.integers(1, 6, (4, 3)).astype(float)
    z = bimonotone(y, w)
    r, c = y.shape
    cons = [{"type": "ineq", "fun": (lambda x, i=i, j=j: x[(i + 1) * c + j] - x[i * c + j])} for i in range(r - 1)
            for j in range(c)]
    cons += [{"type": "ineq", "fun": (lambda x, i=i, j=j: x[i * c + j + 1] - x[i * c + j])} for i in range(r)
             for j in range(c - 1)]
    ref = minimize(lambda x: float(np.sum(w.ravel() * (x - y.ravel()) ** 2)), np.sort(y.ravel()), constraints=cons,
                   method="SLSQP", options={"ftol": 1e-14, "maxiter": 1000}).x.reshape(r, c)
    assert np.abs(z - ref).max() < 1e-5
    assert (np.diff(z, axis=0) >= -1e-12).all() and (np.diff(z, axis=1) >= -1e-12).all()


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
    assert set(fit) >= {"raw_draft_ms", "raw_verify_rows_ms", "residuals", "interval95", "max_residual", "model",
                        "replicates"}
    assert set(table.verify_rows_ms) == set(fit["raw_verify_rows_ms"]) == {1, 2} and set(table.draft_ms) == {1, 2}
    assert set(table.verify_rows_ms[2]) == {1, 2, 3, 4} and table.verify_ms == {}
    loaded = load_costs(write_costs(table, tmp_path / "c.yaml"))
    assert loaded.measurement["fit"]["max_residual"] == fit["max_residual"]
    assert loaded.verify_rows_ms == {b: {m: round(v, 4) for m, v in row.items()} for b, row in table.verify_rows_ms.items()}
    assert len(loaded.replicates()) == len(fit["replicates"])
    for b, row in table.draft_ms.items():
        assert loaded.draft_ms[b] == pytest.approx({k: round(v, 4) for k, v in row.items()})


def test_repeats_that_scatter_too_much_to_pin_a_cost_are_flagged():
    """Monotone on average but each cell's repeats scattered (a machine busy on and off): no
    residual to speak of, but the fit's interval is wide. A quiet 2-core machine's scatter (widest
    intervals 10-40 % in ten profiles) names the cells, as notes; a busy machine's flags the table."""
    from svt.collect.cost_fit import BUSY_UNCERTAINTY, MAX_UNCERTAINTY, fit_notes

    rec = fit_costs(*_samples(noise=0.15, repeats=15), bootstrap=100)[2]
    assert MAX_UNCERTAINTY < rec["max_uncertainty"] < BUSY_UNCERTAINTY
    assert fit_warnings(rec) == [] and any("interval reaching further than 10%" in n for n in fit_notes(rec))
    worst = max((x, f"{kind}[{b}][{j}]") for kind, rows in rec["uncertainty"].items() for b, row in rows.items()
                for j, x in row.items())
    assert worst[0] == rec["max_uncertainty"] and worst[1] in " ".join(fit_notes(rec))
    rec = fit_costs(*_samples(noise=1.2, repeats=15), bootstrap=100)[2]
    assert rec["max_uncertainty"] > BUSY_UNCERTAINTY
    assert any("interval reaches" in w for w in fit_warnings(rec))
    quiet = fit_costs(*_samples(noise=0.01, repeats=15), bootstrap=100)[2]
    assert quiet["max_uncertainty"] < 0.02 and fit_notes(quiet) == []


def _fake_profile(monkeypatch, slow):
    """profile_pair over deterministic timings: ``slow(what, batch, call)`` is the factor that call's
    measurement takes (1: the true cost, with 1 % jitter)."""
    import svt.collect.profile as profile

    calls = {"draft": {}, "verify": {}}
    rng = np.random.default_rng(0)

    def measure(target, draft, draft_batches, verify_cells, k, repeats, context, device, seed=0):
        d, v = {}, {}
        for b in draft_batches:
            n = calls["draft"][b] = calls["draft"].get(b, 0) + 1
            base = np.array([true_draft(b, j) for j in range(1, k + 1)])
            d[b] = base * slow("draft", b, n) * rng.lognormal(0, 0.01, (repeats, k))
        for b, widths in verify_cells.items():
            n = calls["verify"][b] = calls["verify"].get(b, 0) + 1
            v.update({(b, m): list(true_verify(b, m) * slow("verify", b, n) * rng.lognormal(0, 0.01, repeats))
                      for m in widths})
        return d, v, [1.0] * repeats

    monkeypatch.setattr(profile, "_measure", measure)
    monkeypatch.setattr(profile, "machine_load", lambda: {"load_1min": 0.0, "cores": 2, "threads": 2})
    monkeypatch.setattr(profile, "step_overheads", lambda *a, **kw: ({}, {}, None))  # real engine steps: test_profile.py
    target = type("T", (), {"parameters": lambda self: iter([__import__("torch").zeros(1)])})()
    table = profile.profile_pair(target, object(), k=K, batches=BATCHES)
    return table, calls


def test_a_stretch_of_the_machine_busy_is_measured_again_and_outvoted(monkeypatch):
    """Batch 4's drafts ran 40 % slow the first time (another process for a second): the fit does
    not describe them, so they are measured again; the repeats after outvote the disturbed ones."""
    table, calls = _fake_profile(monkeypatch, lambda what, b, n: 1.4 if (what, b, n) == ("draft", 4, 1) else 1.0)
    fit = table.measurement["fit"]
    # batch 4 (and the neighbour the monotone fit pools it with: either may be the one off) again
    assert calls["draft"][4] == 3 and calls["draft"][1] == calls["draft"][64] == 1
    assert 4 in fit["remeasured"][0]["draft"] and fit["remeasured"][0]["verify"] == {}
    assert table.measurement["warnings"] == [] and fit["max_residual"] < 0.05
    assert table.draft_ms[4][K] == pytest.approx(true_draft(4, K), rel=0.03)


def test_a_machine_busy_throughout_is_not_measured_again_but_flagged(monkeypatch):
    """When most of the grid is off, measuring again would only measure the busy machine again."""
    wobble = np.random.default_rng(1).uniform(0.5, 2.0, 1000)
    table, calls = _fake_profile(monkeypatch, lambda what, b, n: wobble[b + 7 * n + (what == "draft")])
    assert max(calls["draft"].values()) == 1 and max(calls["verify"].values()) == 1
    assert table.measurement["warnings"] and table.measurement["fit"]["remeasured"] == []


def _drifting_profile(monkeypatch, order=None):
    """profile_pair with cells that cost exactly their true times on a machine whose speed falls
    steadily to half while it is profiled (a quiet 2-core VM drifted 2x within minutes): the clock
    advances by each sample's cost times the slowdown so far. ``order`` replaces the interleaving."""
    import svt.collect.profile as profile

    clock = {"now": 0.0, "samples": 0}
    total = (len(BATCHES) * (K + 2)) * (profile.REPEATS + 1)

    def spend(ms):
        ms *= 1.0 + clock["samples"] / total  # 1x at the start, 2x at the end
        clock["samples"] += 1
        clock["now"] += ms / 1e3
        return ms

    class Draft:
        def __init__(self, draft, b, k, context, device):
            self.b, self.k = b, k

        def sample(self):
            slow = spend(1.0) / 1.0
            return [true_draft(self.b, j) * slow for j in range(1, self.k + 1)]

    class Verify:
        def __init__(self, target, b, m, cache, context, device):
            self.b, self.m = b, m

        def sample(self):
            return spend(true_verify(self.b, self.m))

    monkeypatch.setattr(profile, "_DraftCell", Draft)
    monkeypatch.setattr(profile, "_VerifyCell", Verify)
    monkeypatch.setattr(profile, "_prefill", lambda *a: None)
    monkeypatch.setattr(profile.time, "perf_counter", lambda: clock["now"])
    monkeypatch.setattr(profile, "machine_load", lambda: {"load_1min": 0.0, "cores": 2, "threads": 2})
    monkeypatch.setattr(profile, "step_overheads", lambda *a, **kw: ({}, {}, None))
    if order is not None:
        monkeypatch.setattr(profile, "_interleaved", order)
    target = type("T", (), {"parameters": lambda self: iter([__import__("torch").zeros(1)])})()
    return profile.profile_pair(target, object(), k=K, batches=BATCHES)


def _shape_error(table) -> float:
    """How far the table's cells are from the true costs' shape: the largest deviation of a cell's
    fitted / true ratio from the median ratio (a uniform level is no error: the machine's speed)."""
    r = np.array([table.verify_rows_ms[b][m] / true_verify(b, m) for b in BATCHES for m in range(1, K + 2)]
                 + [table.draft_ms[b][K] / true_draft(b, K) for b in BATCHES])
    return float(np.max(np.abs(r / np.median(r) - 1)))


def test_cells_interleaved_keep_the_tables_shape_on_a_drifting_machine(monkeypatch):
    """Every cell is sampled once a pass, in a fresh order: the drift slows every cell alike, so the
    table's shape (what the replay's decisions rest on) holds, its level is the profile's average,
    and the drift is recorded and noted. Cell after cell, the same drift bends the table: the first
    cells measured near 1x, the last near 2x."""
    table = _drifting_profile(monkeypatch)
    drift = table.measurement["drift"]
    assert _shape_error(table) < 0.08, _shape_error(table)
    assert drift["passes"] == 15 and drift["slowest"] / drift["fastest"] > 1.7
    assert any("speed moved while it was profiled" in n for n in table.measurement["raw_notes"])

    def one_cell_after_another(cells, repeats, seed):
        out = []
        for c in cells:
            c.sample()
            out.append([c.sample() for _ in range(repeats)])
        return out, [1.0] * repeats

    assert _shape_error(_drifting_profile(monkeypatch, one_cell_after_another)) > 0.3


def test_a_steady_machine_records_no_drift():
    from svt.collect.profile import DRIFT_NOTE, drift_record

    d = drift_record([10.0, 10.2, 9.9, 10.1])
    assert d["passes"] == 4 and d["range"] < DRIFT_NOTE and d["pass_ms_median"] == pytest.approx(10.05)
    assert drift_record([10.0, 20.0, 10.0])["range"] == pytest.approx(1.0)
    assert drift_record([])["passes"] == 0
