"""The HVD replay: hand-walked cycles, τ = ±inf against the single-source policies, the oracle
switch as a bound, and the report on a real greedy run with cache drafts."""

import math

import numpy as np
import pytest

from svt.simulate.costs import CostTable
from svt.simulate.hvd import HVDRequest, WalkResult, oracle_walk, replay_hvd, walk

COSTS = CostTable("measured", draft_ms={1: {1: 1.0, 2: 2.0, 3: 3.0}}, verify_ms={1: 10.0, 2: 10.5, 4: 12.0, 8: 14.0})


def _req(d, c, m, w="w", lookup=0.01):
    d, c, m = (np.asarray(x, dtype=np.int64) for x in (d, c, m))
    return HVDRequest(w, d, c, m, np.full(d.size, lookup))


def test_walk_by_hand():
    # positions 0..9; cache draft of 4 at t=0 yields 3; model yields 1 everywhere
    r = _req([4, 0, 0, 0, 2, 0, 0, 0, 0, 0], [3, 0, 0, 0, 2, 0, 0, 0, 0, 0], [1] * 10)
    use = np.array([True, False, False, False, True, False, False, False, False, False])
    res = walk(r, use, k=3, costs=COSTS, consult=True)
    # t=0 cache (3 + 1 -> t=4), t=4 cache (2 + 1 -> t=7), t=7 model (1 + 1 -> 9), t=9 model (-> 11)
    assert (res.cycles, res.cache_cycles, res.accepted) == (4, 2, 3 + 2 + 1 + 1)
    verify = COSTS.verify
    expected = float(verify(5)) + float(verify(3)) + 2 * (3.0 + float(verify(4))) + 4 * 0.01
    assert res.ms == pytest.approx(expected)
    g = walk(r, None, k=3, costs=COSTS, consult=False)
    assert (g.cycles, g.ms) == (10, 100.0)


def _random_requests(rng, n=12):
    reqs = []
    for i in range(n):
        L = int(rng.integers(5, 60))
        d = np.where(rng.random(L) < 0.6, rng.integers(1, 9, L), 0)
        c = np.minimum(d, rng.integers(0, 9, L))
        m = rng.integers(0, 4, L)
        reqs.append(_req(d, c, m, w="a" if i % 2 else "b", lookup=float(rng.random() * 0.05)))
    return reqs


def test_tau_limits_are_the_single_source_policies_exactly():
    rng = np.random.default_rng(1)
    reqs = _random_requests(rng)
    preds = {"p": [np.where(r.draft_len > 0, rng.random(r.draft_len.size) * 8, 0.0) for r in reqs]}
    rows = replay_hvd(reqs, preds, 3, COSTS)
    for g in ("all", "a", "b"):
        by = {r["policy"]: r for r in rows if r["group"] == g}
        keys = ("cycles", "tokens", "ms", "cache_share", "cycles_per_1000")
        assert {k: by["hvd p tau=inf"][k] for k in keys} == {k: by["model-only"][k] for k in keys}
        assert {k: by["hvd p tau=-inf"][k] for k in keys} == {k: by["cache-only"][k] for k in keys}
        assert by["greedy"]["cycles_per_1000"] == 1000.0
        # the oracle switch is a bound on every policy that chooses between the two sources
        for r in by.values():
            if r["policy"] != "greedy":
                assert by["oracle-switch"]["ms"] <= r["ms"] + 1e-9


def test_oracle_walk_is_optimal_by_enumeration():
    """On short requests, every sequence of per-cycle choices is enumerated."""
    rng = np.random.default_rng(2)
    for _ in range(30):
        r = _random_requests(rng, 1)[0]
        n = min(r.draft_len.size, 9)
        r = HVDRequest("w", r.draft_len[:n], r.cache_yield[:n], r.model_yield[:n], r.lookup_ms[:n])
        best = math.inf
        for mask in range(2 ** n):
            use = np.array([(mask >> t) & 1 for t in range(n)], dtype=bool)
            best = min(best, walk(r, use, 3, COSTS, consult=True).ms)
        assert oracle_walk(r, 3, COSTS).ms == pytest.approx(best)


def test_walkresult_adds():
    a = WalkResult(1, 2, 3.0, 1, 1)
    a += WalkResult(1, 1, 1.0, 0, 0)
    assert (a.cycles, a.tokens, a.ms, a.cache_cycles, a.accepted) == (2, 3, 4.0, 1, 1)


def test_a_prediction_equal_to_tau_does_not_verify_the_cache():
    """The rule is ŷ > τ, strictly: predictions equal to τ use the model drafter."""
    r = _req([4, 4, 4, 4, 4, 4], [4, 4, 4, 4, 4, 4], [1] * 6)
    preds = {"p": [np.full(6, 2.0)]}
    rows = replay_hvd([r], preds, 3, COSTS, taus=(2.0, 1.999))
    by = {x["policy"]: x for x in rows if x["group"] == "all"}
    assert by["hvd p tau=2"]["cycles"] == by["model-only"]["cycles"] == 3
    assert by["hvd p tau=1.999"]["cycles"] == by["cache-only"]["cycles"] == 2


def test_request_intervals_are_replays_of_resampled_requests():
    """Each row's ``request_ci95`` is the percentile range of the same row replayed on requests drawn
    with replacement (checked against replaying the drawn lists from scratch), every policy priced on
    the same draw; a single request has no spread."""
    from svt.simulate.hvd import REQUEST_BOOTSTRAP

    rng = np.random.default_rng(3)
    reqs = _random_requests(rng, n=9)
    preds = {"p": [np.where(r.draft_len > 0, rng.random(r.draft_len.size) * 8, 0.0) for r in reqs]}
    rows = replay_hvd(reqs, preds, 3, COSTS, (0.0, 2.0), bootstrap=40, seed=7)
    rng = np.random.default_rng(7)  # the groups draw in order: "all", then each workload as first seen
    members = {"all": list(range(len(reqs)))}
    for i, r in enumerate(reqs):
        members.setdefault(r.workload, []).append(i)
    ref: dict = {}
    for g, idx in members.items():
        for d in rng.integers(0, len(idx), size=(40, len(idx))):
            picked = [idx[j] for j in d]
            for r in replay_hvd([reqs[j] for j in picked], {"p": [preds["p"][j] for j in picked]}, 3, COSTS,
                                (0.0, 2.0)):
                if r["group"] == "all":  # the whole resample (of one workload's requests, for a workload)
                    for m in ("cycles_per_1000", "speedup_vs_greedy", "speedup_vs_model", "speedup_vs_cache"):
                        ref.setdefault((g, r["policy"], m), []).append(r[m])
    seen = 0
    for r in rows:
        for m, (lo, hi) in r["request_ci95"].items():
            want = ref[(r["group"], r["policy"], m)]
            assert [lo, hi] == pytest.approx(list(np.percentile(want, [2.5, 97.5])), rel=1e-9)
            seen += 1
    assert seen == 3 * 6 * 4  # 3 groups x (greedy, model-only, cache-only, two τ, the oracle switch) x 4 metrics
    assert all("request_ci95" not in r for r in replay_hvd(reqs, preds, 3, COSTS, (0.0,)))  # opt-in
    one = replay_hvd(reqs[:1], {"p": preds["p"][:1]}, 3, COSTS, (0.0,), bootstrap=REQUEST_BOOTSTRAP)
    for r in one:
        for m, (lo, hi) in r["request_ci95"].items():
            assert lo == pytest.approx(hi) == pytest.approx(r[m])


def test_no_requests_replay_to_empty_rows_and_no_traceback():
    rows = replay_hvd([], {"p": []}, 3, COSTS, (0.0,), bootstrap=10)
    assert rows and all(r["tokens"] == 0 and r["cycles"] == 0 and "request_ci95" not in r for r in rows)
