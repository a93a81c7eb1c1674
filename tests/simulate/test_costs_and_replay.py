"""Cost tables and the replay's arithmetic, worked by hand; the oracle against brute force."""

import itertools

import numpy as np
import pytest

from svt.simulate import StepTrace, replay
from svt.simulate.costs import CostTable

ROOF = {"bandwidth_bytes_per_s": 1e12, "peak_flops": 1e15,
        "target": {"params": 1e9, "weight_bytes": 2e9, "overhead_s": 1e-3},
        "drafter": {"params": 1e8, "weight_bytes": 2e8, "overhead_s": 5e-4}}


def test_roofline_by_hand():
    c = CostTable("roofline", "autoregressive", model=ROOF)
    # memory bound: 2e9 B / 1e12 B/s = 2 ms, + 1 ms overhead
    assert float(c.verify(1)) == pytest.approx(3.0)
    # compute bound at 2000 tokens: 2 * 1e9 * 2000 / 1e15 = 4 ms, + 1 ms
    assert float(c.verify(2000)) == pytest.approx(5.0)
    # the drafter: 3 autoregressive passes of max(0.2 ms, ...) + 0.5 ms
    assert c.draft(1, 3) == pytest.approx(3 * 0.7)
    par = CostTable("roofline", "parallel", model=ROOF)
    # one pass over 4 x 3 tokens: still memory bound
    assert par.draft(4, 3) == pytest.approx(0.7)
    assert par.draft(4, 0) == 0.0


@pytest.mark.parametrize("kind", ["measured", "roofline"])
def test_one_count_at_a_time_equals_the_vectorised_costs(kind):
    """The replays ask verify() one whole count at a time (memoised): the same numbers as the
    vectorised call, for Python and numpy integers; fractional counts are interpolated, not memoised."""
    c = (CostTable("measured", "autoregressive", draft_ms={1: {1: 1.0}}, verify_ms={1: 5.0, 4: 4.0, 8: 9.0})
         if kind == "measured" else CostTable("roofline", "autoregressive", model=ROOF))
    t = np.arange(0, 3000, 7)
    vec = c.verify(t)
    for _ in range(2):  # the second pass reads the memo
        assert [float(c.verify(int(x))) for x in t] == vec.tolist()
        assert [float(c.verify(np.int64(x))) for x in t] == vec.tolist()
    lo, mid, hi = float(c.verify(5)), float(c.verify(5.5)), float(c.verify(6))
    assert mid == float(c.verify(np.array([5.5]))[0])
    if kind == "measured":
        assert lo < mid < hi


def test_measured_tables_read_as_non_decreasing_and_scaled_beyond_the_largest_batch():
    c = CostTable("measured", "autoregressive", draft_ms={1: {1: 1.0, 2: 2.0}, 8: {1: 2.0, 2: 4.0}},
                  verify_ms={1: 5.0, 4: 4.0, 8: 9.0})
    assert float(c.verify(4)) == 5.0  # a dip from timing noise is read as flat
    assert float(c.verify(6)) == pytest.approx(7.0)
    assert float(c.verify(12)) == pytest.approx(9.0 + 4 * (9.0 - 5.0) / 4)  # linear beyond the last point
    assert c.draft(16, 2) == pytest.approx(8.0)  # twice the largest measured batch: twice its time
    assert c.draft(8, 2) == 4.0
    assert c.draft(2, 1) == pytest.approx(1.0 + (2.0 - 1.0) / 7)  # between measured batches: linear
    par = CostTable("measured", "parallel", draft_ms=c.draft_ms, verify_ms=c.verify_ms)
    # one pass over 4 x 2 = 8 tokens: the measured single-token pass of a batch of 8
    assert par.draft(4, 2) == 2.0
    assert par.draft(8, 2) == pytest.approx(4.0)  # 16 tokens: beyond the table, in proportion


def _linear(draft=1.0, fixed=10.0, per=1.0):
    return CostTable("measured", "autoregressive", draft_ms={b: {k: draft * k for k in range(1, 6)} for b in (1, 2)},
                     verify_ms={1: fixed + per, 1000: fixed + 1000 * per})


def test_throughput_and_interactivity_by_hand():
    """Two requests at B = 2, K = 2; request 0 accepts 2 then 0, request 1 accepts 1 (one step)."""
    trace = StepTrace(np.array([0, 0, 1]), np.array([0, 1, 0]), np.array([2, 0, 1]), 2,
                      {"p": np.full((3, 2), 0.5)})
    pts = {p["policy"]: p for p in replay(trace, _linear(), concurrency=(2,))}
    k2 = pts["fixed K=2"]
    # step 0: both requests, 2 drafts each: tokens 3 + 2, time draft(2, 2) = 2 + verify(2 + 4) = 16 -> 18 ms
    # step 1: request 0 alone: tokens 1, time 2 + verify(1 + 2) = 13 -> 15 ms
    assert k2["tokens_per_step"] == pytest.approx(6 / 3)
    assert k2["step_ms"] == pytest.approx((18 + 15) / 2)
    assert k2["throughput"] == pytest.approx(6 / 0.033)
    # per request: request 0 emitted 4 tokens over 33 ms, request 1 emitted 2 over 18 ms
    assert k2["interactivity"] == pytest.approx(np.mean([4 / 0.033, 2 / 0.018]))
    k0 = pts["fixed K=0"]  # plain decoding: one token per request per step, verify(B) only
    assert k0["throughput"] == pytest.approx(3 / ((12 + 11) / 1e3))


def test_the_oracle_equals_brute_force_on_a_three_step_trace():
    """One request, three steps: every combination of (draft length, drafts verified) per step is
    enumerated; the oracle's choices on those steps give the best total tokens / total time, and the
    replay's oracle (on the trace's own steps) is that."""
    # verification is cheap up to 3 tokens and expensive beyond: the best choice is mixed (not
    # "as many tokens as possible", not "plain decoding")
    costs = CostTable("measured", draft_ms={1: {k: 0.5 * k for k in range(1, 4)}},
                      verify_ms={1: 10.0, 2: 11.0, 3: 12.0, 4: 30.0})
    a = np.array([2, 0, 3])
    k = 3
    trace = StepTrace(np.zeros(3, int), np.arange(3), a, k, {"p": np.full((3, k), 0.5)})
    options = []
    for ai in a:
        opts = []
        for kk in range(k + 1):
            for b in range(min(ai, kk) + 1):
                opts.append((1 + b, costs.draft(1, kk) + float(costs.verify(1 + b))))
        options.append(opts)
    ratios = [sum(t for t, _ in combo) / sum(m for _, m in combo) * 1e3 for combo in itertools.product(*options)]
    best = max(ratios)
    most_tokens = max(itertools.product(*options), key=lambda c: sum(t for t, _ in c))
    assert sum(t for t, _ in most_tokens) / sum(m for _, m in most_tokens) * 1e3 < best - 1  # a real choice
    from svt.simulate.av import oracle_choices, step_groups

    opts, picks = oracle_choices(step_groups(trace, 1), trace, costs)
    on_trace = sum(o[0][p] for o, p in zip(opts, picks, strict=True)) / sum(o[1][p] for o, p in zip(opts, picks, strict=True))
    assert on_trace * 1e3 == pytest.approx(best, rel=1e-12)
    for compiled in (True, False):
        oracle = next(p for p in replay(trace, costs, concurrency=(1,), compiled=compiled) if p["policy"] == "oracle")
        assert oracle["throughput"] == pytest.approx(best, rel=1e-12)
