"""Each policy's own request-steps: a policy that emits fewer tokens a step runs more steps, and the
batches at B form on its steps, not on the trace policy's."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svt.simulate import StepTrace, replay
from svt.simulate.costs import CostTable
from svt.simulate.steps import capped, policy_rows, policy_trace, request_tokens, step_groups


def linear_costs() -> CostTable:
    """verify(t tokens) = 1 + 0.5 t ms over any rows, draft(n, k) = 0.1 k ms: hand-checkable."""
    draft = {b: {k: 0.1 * k for k in range(1, 7)} for b in (1, 64)}
    verify = {t: 1.0 + 0.5 * t for t in (1, 2, 4, 8, 16, 64, 512)}
    return CostTable("measured", "autoregressive", "linear", draft, verify)


def _loop_rows(trace: StepTrace, tokens: np.ndarray) -> list[tuple[int, int]]:
    """policy_rows by hand: per request, its rows in step order, cycled until it has its tokens."""
    out = []
    for r in sorted(set(trace.request.tolist())):
        mine = sorted(np.flatnonzero(trace.request == r).tolist(), key=lambda i: trace.step[i])
        need = sum(int(trace.a[i]) + 1 for i in mine)
        got, j = 0, 0
        while got < need:
            i = mine[j % len(mine)]
            out.append((i, j))
            got += tokens[i]
            j += 1
    return out


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n_req=st.integers(1, 12), K=st.integers(1, 5))
def test_policy_rows_equal_a_request_by_request_loop(seed, n_req, K):
    rng = np.random.default_rng(seed)
    req, step, a = [], [], []
    for r in rng.permutation(n_req):
        ns = int(rng.integers(1, 9))
        req += [int(r)] * ns
        step += sorted(rng.choice(100, ns, replace=False).tolist())  # step numbers with gaps
        a += rng.integers(0, K + 1, ns).tolist()
    order = rng.permutation(len(req))
    trace = StepTrace(np.array(req)[order], np.array(step)[order], np.array(a)[order], K,
                      {"p": rng.uniform(size=(len(req), K))})
    k = int(rng.integers(0, K + 1))
    tokens = np.minimum(trace.a, k) + 1
    rows, j = policy_rows(trace, tokens)
    assert list(zip(rows.tolist(), j.tolist(), strict=True)) == _loop_rows(trace, tokens)
    own = policy_trace(trace, trace.a + 1)  # the trace's own policy runs its own steps
    assert own is None


def _two_lengths() -> StepTrace:
    """4 requests of 8 tokens each: two emit 4 a step (2 steps at K = 3), two emit 1 (8 steps)."""
    req = [0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3]
    step = [0, 1] + list(range(8)) + [0, 1] + list(range(8))
    a = [3, 3] + [0] * 8 + [3, 3] + [0] * 8
    conf = np.full((len(req), 3), 0.5)
    return StepTrace(np.array(req), np.array(step), np.array(a), 3, {"p": conf}, "continuous")


def test_plain_decoding_fills_its_batches_on_its_own_steps():
    """At K = 0 every request takes 8 steps: two slots stay full for 16 steps, every step verifies
    2 rows of 1 token (2 ms); on the trace policy's steps the batches would have thinned out."""
    trace = _two_lengths()
    costs = linear_costs()
    for compiled in (True, False):
        pts = {p["policy"]: p for p in replay(trace, costs, concurrency=(2,), compiled=compiled)}
        k0 = pts["fixed K=0"]
        assert k0["mean_batch"] == 2.0
        assert k0["step_ms"] == pytest.approx(1.0 + 0.5 * 2)
        assert k0["throughput"] == pytest.approx(32 / (16 * 2.0 / 1e3))
        assert k0["tokens_per_step"] == 1.0
        # the trace's own policy keeps the trace's steps: 20 request-steps over 12 engine steps
        k3 = pts["fixed K=3"]
        assert k3["mean_batch"] == pytest.approx(20 / 12)
        assert k3["tokens_per_step"] == pytest.approx(32 / 20)
    groups = step_groups(trace, 2)
    assert len(groups) == 12 and np.mean([g.size for g in groups]) < 2.0


def test_a_requests_last_step_emits_only_what_it_still_needs():
    """One request of 5 tokens in one step (a = 4, K = 4): at K = 1 it emits 2 + 2 + 1 in 3 steps."""
    trace = StepTrace(np.array([0]), np.array([0]), np.array([4]), 4, {"p": np.full((1, 4), 0.9)})
    rows, j = policy_rows(trace, np.array([2]))
    assert rows.tolist() == [0, 0, 0] and j.tolist() == [0, 1, 2]
    assert capped(np.zeros(3, dtype=np.int64), np.array([2.0, 2.0, 2.0]), request_tokens(trace)).tolist() == [2, 2, 1]
    costs = linear_costs()
    for compiled in (True, False):
        k1 = next(p for p in replay(trace, costs, concurrency=(1,), compiled=compiled) if p["policy"] == "fixed K=1")
        step = 0.1 + 1.0 + 0.5 * 2  # draft 1, verify 2 tokens
        assert k1["tokens_per_step"] == pytest.approx(5 / 3)
        assert k1["throughput"] == pytest.approx(5 / (3 * step / 1e3))


def test_capped_holds_each_request_to_its_budget_in_time_order():
    request = np.array([1, 0, 1, 0, 1])
    tokens = np.array([3.0, 2.0, 3.0, 2.0, 3.0])
    assert capped(request, tokens, np.array([3.0, 7.0])).tolist() == [3, 2, 3, 1, 1]


def test_the_outputs_length_is_the_budget_where_the_run_recorded_it():
    """A request's last step may emit less than its accepted run + 1 (cut at its length): with the
    output's length as budget, plain decoding runs exactly that many steps; a bootstrap draw keeps
    each drawn request's budget; a request without a recorded output is refused."""
    import polars as pl

    from svt.errors import DataError
    from svt.simulate import build_trace
    from svt.simulate.av import resample_requests

    # request 0: two steps, both drafts accepted (3 + 3 tokens, its output 5: the last step cut);
    # request 1: one step, one draft accepted (2 tokens)
    drafts = pl.DataFrame({"_run": [0, 0, 0, 0, 0, 0], "request": [0, 0, 0, 0, 1, 1], "step": [0, 0, 1, 1, 0, 0],
                           "position": [0, 1, 0, 1, 0, 1], "label": [1, 1, 1, 1, 1, 0], "c": [0.5] * 6})
    outputs = pl.DataFrame({"_run": [0, 0], "request": [0, 1], "tokens": [5, 2]})
    trace = build_trace(drafts, {"p": "c"}, outputs=outputs)
    assert trace.budget.tolist() == [5.0, 2.0]
    assert request_tokens(trace).tolist() == [5.0, 2.0]
    assert request_tokens(StepTrace(trace.request, trace.step, trace.a, 2, trace.confidence)).tolist() == [6.0, 2.0]
    k0 = next(p for p in replay(trace, linear_costs(), concurrency=(1,)) if p["policy"] == "fixed K=0")
    assert k0["tokens_per_step"] == 1.0 and k0["throughput"] == pytest.approx(7 / (7 * 1.5 / 1e3))
    for seed in range(4):  # each drawn request keeps its own budget (request 0 has two steps, 1 one)
        draw = resample_requests(trace, np.random.default_rng(seed))
        assert [draw.budget[r] for r in range(2)] == [5.0 if (draw.request == r).sum() == 2 else 2.0 for r in range(2)]
    with pytest.raises(DataError, match="no decoded tokens"):
        build_trace(drafts, {"p": "c"}, outputs=outputs.filter(pl.col("request") == 0))
    with pytest.raises(DataError, match="two output lengths"):
        build_trace(drafts, {"p": "c"}, outputs=pl.concat([outputs, outputs.head(1)]))


def test_the_oracle_bounds_per_step_choices_on_the_trace_steps_not_the_schedule():
    """Drafting costs far more than it saves, so the oracle decodes one token a step; on the K = 3
    trace's steps (requests of 6 and 24 steps) the slots drain, where plain decoding's own steps
    (24 a request) keep all 4 full: the oracle, on the trace's steps, is the per-step bound there
    and plain decoding passes it by its occupancy alone."""
    req, step, a = [], [], []
    for r in range(8):
        n, acc = (6, 3) if r % 2 == 0 else (24, 0)  # 24 tokens each
        req += [r] * n
        step += list(range(n))
        a += [acc] * n
    trace = StepTrace(np.array(req), np.array(step), np.array(a), 3, {"p": np.full((len(req), 3), 0.5)}, "continuous")
    draft = {b: {k: 100.0 * k for k in range(1, 4)} for b in (1, 64)}
    costs = CostTable("measured", "autoregressive", "flat", draft, {t: 10.0 + 0.01 * t for t in (1, 4, 16, 64)})
    from svt.simulate.av import oracle_choices

    groups = step_groups(trace, 4)
    opts, picks = oracle_choices(groups, trace, costs)
    on_trace = 1e3 * sum(o[0][p] for o, p in zip(opts, picks, strict=True)) / sum(o[1][p] for o, p in zip(opts, picks, strict=True))
    for compiled in (True, False):
        pts = {p["policy"]: p for p in replay(trace, costs, concurrency=(4,), compiled=compiled)}
        k0 = pts["fixed K=0"]
        assert k0["mean_batch"] == 4.0 and k0["throughput"] == pytest.approx(192 / (48 * 10.04 / 1e3))
        assert pts["oracle"]["throughput"] == pytest.approx(on_trace, rel=1e-12)
        assert pts["oracle"]["mean_batch"] == pytest.approx(120 / 42)  # the trace's 120 request-steps in 42
        assert pts["oracle"]["throughput"] < 0.8 * k0["throughput"]
        # on the trace's own steps every policy's per-step choice is within the bound
        assert pts["oracle"]["throughput"] >= pts["fixed K=3"]["throughput"]


def test_a_trace_with_gaps_in_its_step_numbers_is_batched_as_every_policys_own_steps():
    """A censored run keeps only its explored steps: with their numbers' gaps a static batch would
    pair the trace's own steps apart (mean batch 1), while every other policy's steps, numbered
    densely, pair up (2). The replay numbers each request's steps densely first."""
    req, a = np.array([0, 0, 1, 1]), np.array([2, 2, 2, 2])
    conf = {"p": np.full((4, 2), 0.5)}
    gappy = StepTrace(req, np.array([0, 10, 5, 15]), a, 2, conf, "static")
    dense = StepTrace(req, np.array([0, 1, 0, 1]), a, 2, conf, "static")
    for compiled in (True, False):
        got = replay(gappy, linear_costs(), concurrency=(2,), compiled=compiled)
        assert got == replay(dense, linear_costs(), concurrency=(2,), compiled=compiled)
        assert {p["policy"]: p["mean_batch"] for p in got}["fixed K=2"] == 2.0


def test_the_flip_rate_batches_a_gappy_trace_as_the_replay_does():
    """The engine rule's flip rate is measured on the replay's batches: a trace whose step numbers
    have gaps gives the same decisions and flips as the same trace numbered densely."""
    from svt.simulate.av import flip_rate
    from svt.simulate.steps import dense_steps

    rng = np.random.default_rng(4)
    req = np.repeat(np.arange(16), 6)
    step = np.tile(np.arange(6), 16) * 5 + rng.integers(0, 5, req.size)  # gaps, order kept
    trace = StepTrace(req, step, rng.integers(0, 4, req.size), 3, {"p": rng.beta(5, 1, size=(req.size, 3))}, "static")
    dense = dense_steps(trace)
    assert dense.step.tolist() == np.tile(np.arange(6), 16).tolist()
    from tests.simulate.test_replay_compiled import bumpy_costs

    costs = bumpy_costs()  # plateaus and steps: the engine rule's decisions move with the batch
    for compiled in (True, False):
        got = flip_rate(trace, "p", costs, 4, compiled=compiled)
        assert got == flip_rate(dense, "p", costs, 4, compiled=compiled)
        assert got["flips"] > 0
