"""The compiled AV replay against the per-step numpy reference: the same points, bit for bit."""

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svt.simulate import StepTrace, replay
from svt.simulate.av import resample_requests, step_groups
from svt.simulate.cost_files import load_costs
from svt.simulate.costs import CostTable
from svt.simulate.steps import policy_trace

COSTS = Path(__file__).resolve().parents[2] / "configs" / "costs"


def bumpy_costs(drafter: str = "autoregressive") -> CostTable:
    """A measured table whose verify curve has plateaus and steps (non-convex, so the engine rule
    and the convex rule differ) and whose draft rows are sparse in batch size (interpolated)."""
    draft = {b: {k: 0.3 * k * (1 + 0.05 * b) for k in range(1, 7)} for b in (1, 3, 8, 64)}
    verify = {1: 2.0, 4: 2.1, 8: 2.1, 12: 3.5, 20: 3.6, 40: 6.0, 64: 6.1, 200: 14.0}
    return CostTable("measured", drafter, "bumpy", draft, verify)


def surface_costs() -> CostTable:
    """A fitted table's shape: verify time over (rows, tokens a row), where rows cost on their own
    (each reads its KV cache) and the widths between rows are interpolated."""
    draft = {b: {k: 0.3 * k * (1 + 0.05 * b) for k in range(1, 7)} for b in (1, 3, 8, 64)}
    rows = {b: {m: 1.5 + 0.2 * b + 0.05 * b * m + (0.8 if m >= 3 else 0.0) for m in range(1, 8)} for b in (1, 2, 5, 16)}
    return CostTable("measured", "autoregressive", "surface", draft, {}, verify_rows_ms=rows)


def random_trace(rng: np.random.Generator, n_req: int, K: int, ties: bool) -> StepTrace:
    req, step, a = [], [], []
    for r in range(n_req):
        ns = int(rng.integers(1, 25))  # requests of different lengths: batches thin out
        req += [r] * ns
        step += list(range(ns))
        a += list(rng.integers(0, K + 1, ns))
    S = len(req)
    conf = {"p": rng.uniform(0.0, 1.0, (S, K)),
            # few distinct values: ties between rows and positions exercise the sort's tie rule
            "q": np.round(rng.uniform(0.0, 1.0, (S, K)), 1) if ties else rng.beta(5, 1, (S, K))}
    conf["q"][rng.uniform(size=S) < 0.1] = 0.0  # some steps with nothing worth verifying
    order = rng.permutation(S)  # trace rows need not come in request order
    return StepTrace(np.array(req)[order], np.array(step)[order], np.array(a)[order], K,
                     {k: v[order] for k, v in conf.items()})


def _assert_same(trace, costs, concurrency=(1, 2, 3, 8, 64)):
    ref = replay(trace, costs, concurrency=concurrency, engine_rule=True, compiled=False)
    new = replay(trace, costs, concurrency=concurrency, engine_rule=True)
    assert [(p["policy"], p["concurrency"]) for p in new] == [(p["policy"], p["concurrency"]) for p in ref]
    for p, q in zip(ref, new, strict=True):
        assert p == q, (p, q)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), n_req=st.integers(1, 30), K=st.integers(1, 6), ties=st.booleans(),
       table=st.sampled_from(["bumpy", "bumpy-parallel", "h100", "surface", "surface-step"]),
       schedule=st.sampled_from(["static", "continuous"]), verification=st.sampled_from(["packed", "padded"]),
       gaps=st.booleans(), budget=st.sampled_from([None, "short", "long"]))
def test_compiled_replay_equals_the_reference(seed, n_req, K, ties, table, schedule, verification, gaps, budget):
    costs = {"bumpy": bumpy_costs(), "bumpy-parallel": bumpy_costs("parallel"), "surface": surface_costs(),
             "surface-step": surface_costs(), "h100": load_costs(COSTS / "h100-llama8b-eagle.yaml")}[table]
    if table == "surface-step":  # the engine's per-step work, charged with the drafts (k = 0 too)
        costs.step_ms = {1: {0: 0.2, 6: 0.9}, 16: {0: 0.6, 6: 2.5}}
    rng = np.random.default_rng(seed)
    trace = random_trace(rng, n_req, K, ties)
    trace.schedule, trace.verification = schedule, verification
    if gaps:  # a censored run's explored steps: numbers with gaps
        trace.step = trace.step * 3 + rng.integers(0, 3, trace.step.size)
    if budget:  # decoded lengths from the run's steps: a last step cut short, or undrafted steps
        own = np.bincount(trace.request, weights=trace.a + 1)
        trace.budget = np.maximum(1.0, own - rng.integers(0, K + 1, own.size)) if budget == "short" else own + rng.integers(0, 40, own.size)
    _assert_same(trace, costs)


def test_a_padded_engine_pays_for_its_longest_kept_row():
    """Under padded verification an AV step costs draft(n, K) + verify(n (1 + longest kept)); packed,
    draft(n, K) + verify(n + kept drafts): same decisions, other prices."""
    from svt.simulate.av import av_keep

    trace = random_trace(np.random.default_rng(5), 12, 4, ties=False)
    costs = surface_costs()
    pts = {}
    for verification in ("packed", "padded"):
        trace.verification = verification
        pts[verification] = {p["policy"]: p for p in replay(trace, costs, concurrency=(4,), compiled=False)}
    tokens = np.zeros(trace.a.size)  # AV on the trace's steps: the request-steps it runs itself
    for rows in step_groups(trace, 4):
        tokens[rows] = np.minimum(trace.a[rows], av_keep(trace.confidence["p"][rows], costs, "convex")) + 1
    own = policy_trace(trace, tokens)
    groups = step_groups(own, 4)
    ms = {"packed": 0.0, "padded": 0.0}
    for rows in groups:
        kept = av_keep(own.confidence["p"][rows], costs, "convex")
        n = len(rows)
        ms["packed"] += costs.draft(n, 4) + float(costs.verify(n + kept.sum(), rows=n))
        ms["padded"] += costs.draft(n, 4) + float(costs.verify(n * (1 + kept.max()), rows=n))
    for v in ("packed", "padded"):
        assert pts[v]["AV p"]["step_ms"] == pytest.approx(ms[v] / len(groups), rel=1e-12)
        assert pts[v]["fixed K=2"] == pts["packed"]["fixed K=2"]  # every row verifies K: no padding
    assert pts["padded"]["AV p"]["throughput"] < pts["packed"]["AV p"]["throughput"]


def test_compiled_replay_equals_the_reference_on_a_bootstrap_draw():
    """Resampled traces repeat requests under new numbers: the replay intervals' input."""
    rng = np.random.default_rng(3)
    trace = random_trace(rng, 40, 5, ties=True)
    _assert_same(resample_requests(trace, rng), bumpy_costs(), concurrency=(1, 4, 16))


@pytest.mark.parametrize("B", [1, 5])
def test_the_oracle_still_bounds_every_policy(B):
    trace = random_trace(np.random.default_rng(11), 20, 5, ties=False)
    pts = replay(trace, bumpy_costs(), concurrency=(B,), engine_rule=True)
    oracle = next(p for p in pts if p["policy"] == "oracle")
    assert all(p["throughput"] <= oracle["throughput"] * (1 + 1e-12) for p in pts)


def test_build_trace_places_each_confidence_at_its_step_and_position():
    """Against a row-by-row construction: steps of different lengths (missing positions read 0),
    rows in any order; a null confidence is refused."""
    import polars as pl

    from svt.errors import DataError
    from svt.simulate import build_trace

    rng = np.random.default_rng(2)
    rows = []
    for req in range(6):
        for step in range(int(rng.integers(1, 6))):
            for pos in range(int(rng.integers(1, 5))):
                rows.append({"_run": 0, "request": req, "step": step, "position": pos,
                             "label": int(rng.integers(0, 2)), "c": float(rng.uniform())})
    d = pl.DataFrame(rows).sample(fraction=1.0, shuffle=True, seed=1)
    trace = build_trace(d, {"p": "c"})
    keys = sorted({(r["request"], r["step"]) for r in rows})
    want = np.zeros((len(keys), 4))
    for r in rows:
        want[keys.index((r["request"], r["step"])), r["position"]] = r["c"]
    assert np.array_equal(trace.confidence["p"], want)
    assert trace.request.tolist() == [k[0] for k in keys] and trace.step.tolist() == [k[1] for k in keys]
    with pytest.raises(DataError, match="missing confidences"):
        build_trace(d.with_columns(pl.when(pl.col("position") == 1).then(None).otherwise(pl.col("c")).alias("c")),
                    {"p": "c"})


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10**6), K=st.integers(1, 5), B=st.sampled_from([1, 3, 8]),
       rule=st.sampled_from(["engine", "convex"]))
def test_compiled_flip_rate_equals_the_reference(seed, K, B, rule):
    """The rule audit's flip counts: every variant decided in one compiled call per step, the same
    decisions as the loop over av_keep (on a bumpy table the engine rule does flip)."""
    from svt.simulate.av import flip_rate

    trace = random_trace(np.random.default_rng(seed), 12, K, ties=True)
    for name in trace.confidence:
        ref = flip_rate(trace, name, bumpy_costs(), B, rule=rule, max_steps=15, compiled=False)
        new = flip_rate(trace, name, bumpy_costs(), B, rule=rule, max_steps=15)
        assert (new["decisions"], new["flips"]) == (ref["decisions"], ref["flips"])
        assert new["rate"] == ref["rate"] or (K == 1 and np.isnan(new["rate"]) and np.isnan(ref["rate"]))


def test_the_engine_rule_flips_on_a_bumpy_table():
    """So the equality above compares counts that are not all zero."""
    from svt.simulate.av import flip_rate

    trace = random_trace(np.random.default_rng(0), 20, 5, ties=False)
    assert flip_rate(trace, "p", bumpy_costs(), 8, rule="engine", max_steps=40)["flips"] > 0
    assert flip_rate(trace, "p", bumpy_costs(), 8, rule="convex", max_steps=40)["flips"] == 0
