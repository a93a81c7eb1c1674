"""The HVD map's sweep and the two-sided switch, on synthetic traces with known answers."""

import math
from pathlib import Path

import numpy as np
import pytest

from svt.simulate.hvd import HVDRequest, walk
from svt.simulate.hvd_sweep import (
    Split,
    model_yield_features,
    policy_results,
    rate_for_tokens_per_cycle,
    strength_map,
    two_sided,
    with_model_yields,
)
from svt.simulate.stand_in import stand_in_yields


@pytest.fixture
def costs():
    from svt.simulate.costs import load_costs

    return load_costs(Path(__file__).resolve().parents[2] / "configs" / "costs" / "h100-llama8b-eagle.yaml")


@pytest.mark.parametrize("k", [1, 3, 5, 8])
@pytest.mark.parametrize("tokens", [1.5, 2.0, 3.0])
def test_rate_gives_the_tokens_per_cycle(k, tokens):
    if tokens > k + 1:
        pytest.skip("beyond K + 1")
    a = rate_for_tokens_per_cycle(tokens, k)
    assert 1 + sum(a ** i for i in range(1, k + 1)) == pytest.approx(tokens, abs=1e-9)


def _requests(n_req=6, n=4000, seed=0):
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(n_req):
        d = rng.integers(0, 9, n)
        c = np.minimum(rng.integers(0, 9, n), d)
        reqs.append(HVDRequest("a" if i % 2 else "b", d, c, np.zeros(n, np.int64), np.full(n, 0.01)))
    return reqs


def test_stand_in_strength_is_the_model_onlys_tokens_per_cycle(costs):
    reqs = _requests()
    preds = [r.cache_yield.astype(float) for r in reqs]  # a perfect yield predictor
    split = Split([0, 1, 2], [3, 4, 5], "test")
    rows = strength_map(reqs, preds, list(range(6)), 5, costs, split, seed=1, strengths=(1.5, 3.0))
    for r in rows:
        assert 1000.0 / r["model-only"]["cycles_per_1000"] == pytest.approx(r["strength"], rel=0.04)
        # the oracle bounds every policy; HVD with a perfect predictor is at least as fast as cache-only
        # on the scored requests up to τ chosen elsewhere
        assert r["oracle-switch"]["ms"] <= min(r["hvd"]["ms"], r["model-only"]["ms"], r["cache-only"]["ms"]) + 1e-6
    assert {r["group"] for r in rows} == {"all", "a", "b"}


def test_each_map_cells_gain_has_a_request_level_bootstrap_interval(costs):
    """The interval resamples the scored requests: checked against a direct resampling of the
    per-request times of the three policies, with the same generator."""
    from svt.simulate.hvd_sweep import gain_interval

    reqs = _requests(8, 600)
    preds = [r.cache_yield.astype(float) for r in reqs]
    split = Split([0, 1, 2, 3], [4, 5, 6, 7], "test")
    rows = strength_map(reqs, preds, list(range(8)), 5, costs, split, seed=3, strengths=(2.0,))
    row = next(r for r in rows if r["group"] == "all")
    lo, hi = row["gain_interval"]
    assert lo <= row["hvd_gain_over_best_single"] <= hi and row["bootstrap"] == 200
    assert row["gain_interval_spans_zero"] == (lo <= 0 <= hi) and row["few_requests"] is True
    res = policy_results(with_model_yields(reqs, [stand_in_yields(np.full(5, rate_for_tokens_per_cycle(2.0, 5)), 3, i,
                                                                  r.draft_len.size) for i, r in enumerate(reqs)]),
                         preds, 5, costs, [0, 1, 2, 3], [4, 5, 6, 7])
    ms = res["per_request_ms"]
    assert ms["hvd"].sum() == pytest.approx(res["hvd"].ms) and ms["hvd"].size == 4
    # the interval itself, on 30 requests' times: a direct resampling with the same generator
    g = np.random.default_rng(11)
    ms = {"model-only": g.uniform(50, 100, 30), "cache-only": g.uniform(40, 120, 30), "hvd": g.uniform(40, 90, 30)}
    idx = np.random.default_rng(7).integers(0, 30, size=(200, 30))
    gains = np.minimum(ms["model-only"][idx].sum(1), ms["cache-only"][idx].sum(1)) / ms["hvd"][idx].sum(1) - 1
    assert gain_interval(ms, np.random.default_rng(7)) == pytest.approx(tuple(np.percentile(gains, [2.5, 97.5])))


def test_tau_is_chosen_on_the_choose_set_only(costs):
    """Scores of the scored requests must not influence τ: changing them leaves τ as it was."""
    reqs = _requests(4, 500)
    preds = [r.cache_yield.astype(float) for r in reqs]
    a = policy_results(reqs, preds, 5, costs, [0, 1], [2, 3])
    preds2 = [*preds[:2], -preds[2], -preds[3]]
    b = policy_results(reqs, preds2, 5, costs, [0, 1], [2, 3])
    assert a["tau"] == b["tau"]
    want = sum(walk(reqs[i], preds[i] > a["tau"], 5, costs, consult=a["tau"] < math.inf).ms for i in (2, 3))
    assert a["hvd"].ms == pytest.approx(want)


def test_model_yield_features_use_only_observed_yields():
    m = np.array([2, 0, 0, 1, 0, 0])
    f = model_yield_features(m, {"draft_len": np.zeros(6), "match_len": np.zeros(6), "score": np.zeros(6)},
                             np.zeros(6))
    # m[u] is known from t = u + m[u] + 1 on: m[1] from 2; m[0] (2: positions 0, 1 accepted, 2 rejected)
    # and m[2] from 3; m[3], m[4] from 5
    assert f[:, 4].tolist() == [0, 0, 1, 3, 3, 5]
    assert f[:, 1].tolist() == [-1, -1, 0, 0, 0, 0]  # the last observed (m[2], then m[4])
    assert f[:, 2].tolist() == pytest.approx([-1, -1, 0, 2 / 3, 2 / 3, 3 / 4])  # mean of the last 4 observed


def test_two_sided_switch_learns_a_drafter_with_memory(costs):
    """A drafter whose yield is predictable from its observed past (long streaks of 5 or 0): the
    two-sided rule beats the one-sided one, which cannot see it."""
    rng = np.random.default_rng(0)
    reqs, preds, cols = [], [], []
    for _ in range(8):
        n = 3000
        regime = np.repeat(rng.integers(0, 2, n // 300), 300)
        m = np.where(regime == 1, 5, 0)
        d = np.full(n, 3)
        c = np.full(n, 2)
        reqs.append(HVDRequest("w", d, c, m, np.full(n, 0.01)))
        preds.append(c.astype(float))
        cols.append({"draft_len": d.astype(float), "match_len": np.ones(n), "score": np.ones(n)})
    out = two_sided(reqs, preds, cols, 5, costs, Split([0, 1, 2, 3], [4, 5, 6, 7], "test"))
    g = out["groups"]["all"]
    assert g["two_sided"]["ms"] < g["one_sided"]["ms"]
    assert g["oracle"]["ms"] <= g["two_sided"]["ms"] + 1e-6


def test_tau_follows_the_choose_set_when_the_sets_disagree(costs):
    """Choose set: the cache always misses (the model drafter is perfect), so τ must switch the cache
    off; scored set: the cache is perfect. τ picked on the scored set would be −inf (cache-only). The
    lookups are free here, so on the choose set every τ >= 0 ties and the first (0) is kept."""
    n = 400
    bad = HVDRequest("w", np.full(n, 8), np.zeros(n, np.int64), np.full(n, 5), np.zeros(n))
    good = HVDRequest("w", np.full(n, 8), np.full(n, 8), np.zeros(n, np.int64), np.zeros(n))
    reqs = [bad, bad, good, good]
    preds = [np.full(n, 0.0), np.full(n, 0.0), np.full(n, 8.0), np.full(n, 8.0)]
    res = policy_results(reqs, preds, 5, costs, [0, 1], [2, 3])
    assert res["tau"] == 0.0  # the cache (predicted 0) is never verified on the choose set
    assert res["hvd"].cache_cycles == res["hvd"].cycles  # ... while the scored requests' drafts all pass τ = 0
