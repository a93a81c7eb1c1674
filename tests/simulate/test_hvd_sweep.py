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
    from svt.simulate.cost_files import load_costs

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


def _disagreeing(n=400):
    """Choose set: the cache is predicted to yield 8 but yields nothing; scored set: predicted 8
    and yields 8. On the choose set every τ below 8 verifies useless cache drafts, so τ must be 8
    or more there; chosen on the scored set it would be below 8 (the cache pays)."""
    liar = HVDRequest("w", np.full(n, 8), np.zeros(n, np.int64), np.full(n, 2), np.zeros(n))
    good = HVDRequest("w", np.full(n, 8), np.full(n, 8), np.full(n, 2), np.zeros(n))
    return [liar, liar, good, good], [np.full(n, 8.0)] * 4, Split([0, 1], [2, 3], "test")


def test_the_map_chooses_tau_on_the_choose_set(costs):
    """Issue 34: the map's own call of the τ choice (strength_map) had no test; a τ chosen on the
    scored requests there passed."""
    reqs, preds, split = _disagreeing()
    rows = strength_map(reqs, preds, [0, 1, 2, 3], 5, costs, split, seed=1)
    assert rows and all(r["tau"] >= 8.0 for r in rows), [r["tau"] for r in rows]
    assert policy_results(reqs, preds, 5, costs, [2, 3], [2, 3])["tau"] < 8.0  # the scored set's own would not be


def test_the_two_sided_reports_the_one_sided_tau_chosen_on_the_choose_set(costs):
    reqs, preds, split = _disagreeing()
    cols = [{"draft_len": r.draft_len.astype(float), "match_len": np.ones(r.draft_len.size),
             "score": np.ones(r.draft_len.size)} for r in reqs]
    out = two_sided(reqs, preds, cols, 5, costs, split)
    assert out["groups"]["all"]["one_sided_tau"] >= 8.0


def _growing():
    """A cost table whose verify time grows with the tokens verified (10 ms per token): every
    shipped table is flat at batch 1, where a wrong verify charge changes nothing."""
    from svt.simulate.costs import CostTable

    return CostTable(kind="measured", draft_ms={1: {1: 1.0, 5: 5.0}}, verify_ms={t: 10.0 * t for t in range(1, 17)})


def test_the_two_sided_margin_follows_the_verify_time_of_the_drafts_own_length():
    """Cache drafts of 8 tokens yielding 2, a model drafter (K = 5) yielding 2: per token the cache
    costs verify(9) = 90 ms a cycle, the model draft(1, 5) + verify(6) = 65 ms. The model wins, so
    every margin at or above the rates' ratio ties (model only) and the first such margin is kept.
    Charging the cache verify(1 + K) instead (60 ms) moves the ratio above 1 and the margin with it."""
    from svt.simulate.hvd_sweep import MARGINS

    costs, n, k = _growing(), 600, 5
    reqs = [HVDRequest("w", np.full(n, 8), np.full(n, 2), np.full(n, 2), np.zeros(n)) for _ in range(4)]
    preds = [np.full(n, 2.0)] * 4
    cols = [{"draft_len": np.full(n, 8.0), "match_len": np.ones(n), "score": np.ones(n)} for _ in reqs]
    out = two_sided(reqs, preds, cols, k, costs, Split([0, 1], [2, 3], "test"))
    g = out["groups"]["all"]
    cache_rate = 3 / float(costs.verify(9))
    model_rate = 3 / (costs.draft(1, k) + float(costs.verify(1 + k)))
    assert g["margin"] == min(m for m in MARGINS if m >= cache_rate / model_rate) == 0.8
    assert g["two_sided"]["cache_share"] == 0.0
    assert g["two_sided"]["ms"] == pytest.approx(g["model_only"]["ms"])


def test_the_margin_is_chosen_on_the_choose_set():
    """Choose set: the cache yields nothing (its predicted 4 lies); scored set: it yields 8. The
    predicted rates' ratio is (4 + 1) / 90 against 3 / 65 = 1.20: margins up to 1.1 verify the
    cache, from 1.25 on the model. On the choose set the first margin that switches the cache off
    (1.25) is best; chosen on the scored set it would be 0.5 (the cache pays there)."""
    costs, n, k = _growing(), 400, 5
    liar = HVDRequest("w", np.full(n, 8), np.zeros(n, np.int64), np.full(n, 2), np.zeros(n))
    good = HVDRequest("w", np.full(n, 8), np.full(n, 8), np.full(n, 2), np.zeros(n))
    reqs = [liar, liar, good, good]
    preds = [np.full(n, 4.0)] * 4
    cols = [{"draft_len": np.full(n, 8.0), "match_len": np.ones(n), "score": np.ones(n)} for _ in reqs]
    g = two_sided(reqs, preds, cols, k, costs, Split([0, 1], [2, 3], "test"))["groups"]["all"]
    assert g["margin"] == 1.25 and g["two_sided"]["cache_share"] == 0.0


def test_a_cache_cycle_pays_the_verify_time_of_its_own_draft_length():
    """Under a table whose verify time grows with the tokens, each cache cycle pays lookup +
    verify(1 + its draft's length), each model cycle draft(1, K) + verify(1 + K) (a flat table
    cannot tell these apart)."""
    from svt.simulate.hvd import oracle_walk

    costs, k = _growing(), 5
    rng = np.random.default_rng(4)
    n = 300
    d = rng.integers(0, 12, n)
    c = np.minimum(rng.integers(0, 4, n), d)
    m = rng.integers(0, k + 1, n)
    req = HVDRequest("w", d, c, m, np.full(n, 0.5))
    use = rng.random(n) < 0.5
    got = walk(req, use, k, costs, consult=True)
    want, t = 0.0, 0
    while t < n:
        if use[t]:
            want += 0.5 + 10.0 * (1 + d[t])
            t += c[t] + 1
        else:
            want += 0.5 + 5.0 + 10.0 * (1 + k)
            t += m[t] + 1
    assert got.ms == pytest.approx(want)
    best = oracle_walk(req, k, costs)  # its walk must follow the optimum it computed with these charges
    assert best.ms <= min(walk(req, np.zeros(n, bool), k, costs, consult=True).ms,
                          walk(req, np.ones(n, bool), k, costs, consult=True).ms) + 1e-9
