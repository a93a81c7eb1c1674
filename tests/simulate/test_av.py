"""The Adaptive Verification replay: hand-computed arithmetic and properties that must hold."""

from pathlib import Path

import numpy as np
import pytest

from svt.simulate import StepTrace, replay
from svt.simulate.av import av_keep, mark_pareto
from svt.simulate.cost_files import load_costs
from svt.simulate.costs import CostTable

COSTS = Path(__file__).resolve().parents[2] / "configs" / "costs"


def linear_costs(draft_per_token=1.0, verify_fixed=10.0, verify_per_token=0.5, drafter="autoregressive"):
    """A measured-style table with exact linear costs."""
    draft = {b: {k: draft_per_token * k for k in range(1, 9)} for b in (1, 2, 4, 8, 16, 32, 64)}
    verify = {t: verify_fixed + verify_per_token * t for t in (1, 1000)}
    return CostTable("measured", drafter, "test", draft, verify)


def test_budget_arithmetic_on_a_hand_computed_batch():
    # two requests, K = 2: survivals [0.9, 0.45] and [0.5, 0.05]; sorted 0.9, 0.5, 0.45, 0.05
    conf = np.array([[0.9, 0.5], [0.5, 0.1]])
    costs = linear_costs(draft_per_token=1.0, verify_fixed=10.0, verify_per_token=1.0)
    # expected tokens for b = 0..4: 2, 2.9, 3.4, 3.85, 3.9; cost = draft(2, 2) = 2 + verify(2 + b)
    # = 14, 15, 16, 17, 18 -> ratios .1429 .1933 .2125 .2265 .2167 -> b* = 3
    kept = av_keep(conf, costs)
    assert kept.tolist() == [2, 1]


def _trace(a, conf, k):
    n = len(a)
    return StepTrace(np.arange(n) % 4, np.arange(n) // 4, np.asarray(a), k, {"p": np.asarray(conf, dtype=float)})


def test_all_accepted_and_free_verification_keeps_every_draft():
    rng = np.random.default_rng(0)
    k = 4
    a = np.full(64, k)
    conf = rng.uniform(0.05, 0.99, (64, k))
    costs = linear_costs(draft_per_token=0.0, verify_fixed=10.0, verify_per_token=0.0)
    pts = {(p["policy"], p["concurrency"]): p for p in replay(_trace(a, conf, k), costs, concurrency=(1, 4))}
    for B in (1, 4):
        assert pts[("AV p", B)]["tokens_per_step"] == pytest.approx(k + 1)
        assert pts[(f"fixed K={k}", B)]["tokens_per_step"] == pytest.approx(k + 1)


def test_zero_confidence_keeps_nothing_plain_decoding():
    k = 3
    a = np.array([3, 1, 0, 2] * 4)
    costs = linear_costs()
    pts = {(p["policy"], p["concurrency"]): p for p in replay(_trace(a, np.zeros((16, k)), k), costs, concurrency=(4,))}
    assert pts[("AV p", 4)]["tokens_per_step"] == pytest.approx(1.0)
    assert pts[("fixed K=0", 4)]["tokens_per_step"] == pytest.approx(1.0)
    # AV still paid for drafting K tokens (autoregressive drafter): slower than plain decoding
    assert pts[("AV p", 4)]["step_ms"] > pts[("fixed K=0", 4)]["step_ms"]


@pytest.mark.parametrize("drafter", ["autoregressive", "parallel"])
def test_the_oracle_is_never_beaten_on_throughput(drafter):
    rng = np.random.default_rng(1)
    k, n = 5, 400
    a = np.minimum(rng.geometric(0.45, n) - 1, k)
    conf = np.clip(rng.normal(0.6, 0.2, (n, k)), 0.01, 0.99)
    for costs in (linear_costs(drafter=drafter), linear_costs(0.2, 5, 0.02, drafter),
                  load_costs(COSTS / "h100-llama8b-eagle.yaml")):
        trace = StepTrace(np.arange(n) % 40, np.arange(n) // 40, a, k, {"p": conf, "noise": rng.random((n, k))})
        pts = replay(trace, costs, concurrency=(1, 8, 32))
        for B in (1, 8, 32):
            mine = [p for p in pts if p["concurrency"] == B]
            best = max(p["throughput"] for p in mine if p["policy"] != "oracle")
            oracle = next(p for p in mine if p["policy"] == "oracle")["throughput"]
            assert oracle >= best * (1 - 1e-12)


def test_parallel_drafters_pay_one_pass():
    ar, par = linear_costs(drafter="autoregressive"), linear_costs(drafter="parallel")
    assert ar.draft(8, 5) == pytest.approx(5 * par.draft(8, 5))


def test_pareto_marks_non_dominated_points():
    pts = [{"interactivity": 1, "throughput": 5}, {"interactivity": 2, "throughput": 4},
           {"interactivity": 1.5, "throughput": 3}, {"interactivity": 2, "throughput": 4}]
    mark_pareto(pts)
    assert [p["pareto"] for p in pts] == [True, True, False, True]


def test_roofline_files_are_models_that_say_so():
    for name in ("h100-llama8b-eagle", "h200-llama70b-fp8-eagle", "h200-llama70b-fp8-parallel"):
        c = load_costs(COSTS / f"{name}.yaml")
        assert c.kind == "roofline" and "MODEL, not a measurement" in c.description
        v = c.verify(np.array([1, 64, 4096]))
        assert v[0] == v[1] < v[2]  # memory-bound for small batches, compute-bound for large ones


@pytest.mark.parametrize("text, msg", [
    ("kind: guessed\n", "kind: measured"),
    ("kind: measured\ndraft_ms: 3\n", "draft_ms\\[batch\\]\\[k\\]"),
    ("kind: roofline\nmodel: {target: {params: 1}}\n", "roofline model needs numbers"),
    ("kind: measured\ndrafter: telepathic\n", "autoregressive or parallel"),
    ("a: [1,\n", "not valid YAML"),
])
def test_bad_cost_tables_get_one_clear_message(tmp_path, text, msg):
    from svt.errors import ConfigError

    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=msg):
        load_costs(f)
    with pytest.raises(ConfigError, match="not found"):
        load_costs(tmp_path / "none.yaml")


def test_draft_lengths_by_hand_and_causal():
    from svt.simulate.av import draft_lengths

    # B = 1, K = 3: plain decoding 10 ms (rate 0.1 token/ms); one more verified token 1 ms; each
    # extra draft pass 2 ms: drafting j + 1 is worth it when survival_j * next_conf > 0.3
    costs = linear_costs(draft_per_token=2.0, verify_fixed=9.0, verify_per_token=1.0)
    next_conf = np.array([0.9, 0.6, 0.6])
    assert draft_lengths(np.array([[0.9, 0.9, 0.9]]), costs, next_conf).tolist() == [3]  # .54, .49
    assert draft_lengths(np.array([[0.9, 0.5, 0.9]]), costs, next_conf).tolist() == [2]  # .54 then .27
    assert draft_lengths(np.array([[0.4, 0.9, 0.9]]), costs, next_conf).tolist() == [1]  # .24
    rng = np.random.default_rng(0)
    for _ in range(200):  # a request's length past j never depends on its confidences after j
        c = rng.uniform(0.05, 0.99, (4, 5))
        base = draft_lengths(c, costs, c.mean(0))
        r, j = rng.integers(0, 4), rng.integers(0, 4)
        alt = c.copy()
        alt[r, j + 1:] = rng.uniform(0.05, 0.99, 5 - j - 1)
        assert (draft_lengths(alt, costs, c.mean(0))[r] > j + 1) == (base[r] > j + 1)


def test_av_with_draft_lengths_is_replayed_beside_av():
    rng = np.random.default_rng(2)
    k, n = 4, 300
    a = np.minimum(rng.geometric(0.4, n) - 1, k)
    trace = StepTrace(np.arange(n) % 30, np.arange(n) // 30, a, k, {"p": np.clip(rng.normal(0.6, 0.2, (n, k)), 0.01, 0.99)})
    pts = replay(trace, load_costs(COSTS / "h100-llama8b-eagle.yaml"), concurrency=(1, 8))
    names = {p["policy"] for p in pts}
    assert {"AV p", "AV+length p", "oracle"} <= names
    for B in (1, 8):
        mine = {p["policy"]: p for p in pts if p["concurrency"] == B}
        assert mine["oracle"]["throughput"] >= mine["AV+length p"]["throughput"]
        assert 1 <= mine["AV+length p"]["tokens_per_step"] <= k + 1
