"""The cost model's uncertainty carried into the replays: every AV and HVD policy replayed again on
the fit's bootstrap refits, each point given its 95 % range, and the gains paired (one refit prices
both sides). A refit equal to the table gives a range of one point; refits that move the costs
move the ranges; a table without refits adds nothing."""

import json

import numpy as np
import pytest

from svt.simulate import replay
from svt.simulate.av import cost_intervals
from svt.simulate.costs import CostTable

GRID = {1: {1: 2.0, 2: 2.1, 3: 2.3, 4: 2.6}, 4: {1: 2.6, 2: 3.1, 3: 3.8, 4: 4.6}, 16: {1: 5.0, 2: 7.0, 3: 9.5, 4: 12.0}}
DRAFT = {b: {k: 0.4 * k * (1 + 0.05 * b) for k in range(1, 4)} for b in (1, 4, 16)}


def _table(verify_scales=(), draft_scales=()) -> CostTable:
    reps = [{"draft_ms": {b: {k: v * d for k, v in row.items()} for b, row in DRAFT.items()},
             "verify_rows_ms": {b: {m: v * s for m, v in row.items()} for b, row in GRID.items()}}
            for s, d in zip(verify_scales, draft_scales, strict=True)]
    return CostTable("measured", draft_ms=DRAFT, verify_rows_ms=GRID, measurement={"fit": {"replicates": reps}})


def _trace():
    from tests.simulate.test_replay_compiled import random_trace

    return random_trace(np.random.default_rng(3), 20, 3, ties=False)


def test_refits_equal_to_the_table_give_ranges_of_one_point():
    trace, costs = _trace(), _table((1.0, 1.0, 1.0), (1.0, 1.0, 1.0))
    points = replay(trace, costs, concurrency=(1, 4))
    assert cost_intervals(trace, costs, points) == 3
    for p in points:
        for m in ("throughput", "interactivity"):
            assert p["cost_ci95"][m] == pytest.approx([p[m], p[m]], rel=1e-12)


def test_refits_that_move_the_costs_move_the_ranges_and_the_gains_are_paired():
    trace = _trace()
    scales = np.linspace(0.8, 1.25, 9)
    costs = _table(scales, scales[::-1])  # verify dearer while drafting is cheaper, and back
    points = replay(trace, costs, concurrency=(1, 4, 16))
    cost_intervals(trace, costs, points)
    for p in points:
        lo, hi = p["cost_ci95"]["throughput"]
        assert lo < p["throughput"] < hi or p["policy"] == "fixed K=0" and lo <= p["throughput"] <= hi
    for b in (1, 4, 16):
        fixed = [p for p in points if p["concurrency"] == b and p["policy"].startswith("fixed")]
        # under every refit one fixed length is the best: its ratio's upper end is exactly 1
        assert max(p["cost_ci95"]["vs_best_fixed"][1] for p in fixed) == pytest.approx(1.0)
        assert all(p["cost_ci95"]["vs_best_fixed"][1] <= 1.0 + 1e-12 for p in fixed)


def test_a_table_without_refits_adds_nothing():
    trace = _trace()
    costs = CostTable("measured", draft_ms=DRAFT, verify_rows_ms=GRID)
    points = replay(trace, costs, concurrency=(1,))
    assert cost_intervals(trace, costs, points) == 0 and not any("cost_ci95" in p for p in points)


def test_hvd_speedups_get_their_cost_ranges():
    from svt.simulate.hvd import HVDRequest, replay_hvd
    from svt.simulate.hvd import cost_intervals as hvd_intervals

    rng = np.random.default_rng(0)
    reqs, preds = [], {"score": []}
    for w in ("a", "b"):
        for _ in range(4):
            n = 30
            reqs.append(HVDRequest(w, rng.integers(0, 6, n), rng.integers(0, 4, n), rng.integers(0, 3, n),
                                   np.full(n, 0.05)))
            preds["score"].append(rng.uniform(0, 4, n))
    scales = np.linspace(0.7, 1.4, 7)
    costs = _table(scales, np.ones_like(scales))  # verify dearer or cheaper, drafting the same
    rows = replay_hvd(reqs, preds, 3, costs, (0.5, 1.5))
    assert hvd_intervals(reqs, preds, 3, costs, (0.5, 1.5), rows) == 7
    moved = [r for r in rows if r["policy"] == "model-only" and r["group"] == "all"][0]["cost_ci95"]["speedup_vs_greedy"]
    assert moved[0] < moved[1]
    greedy = [r for r in rows if r["policy"] == "greedy"][0]["cost_ci95"]["speedup_vs_greedy"]
    assert greedy == pytest.approx([1.0, 1.0])


def test_the_report_and_the_pareto_figure_carry_the_ranges(tiny_pair, small_run, tmp_path):
    """End to end: a profiled table keeps its refits; evaluate replays on them; report.md has the
    range columns; the Pareto figure draws whiskers and passes the readability checks."""
    from typer.testing import CliRunner

    from svt.cli import app
    from svt.collect.profile import profile_pair
    from svt.plots import PLOTS
    from svt.plots.readability import problems
    from svt.simulate.cost_files import write_costs

    k = json.loads((small_run / "run.json").read_text())["k"]
    table = profile_pair(tiny_pair.target, tiny_pair.draft, k=k, batches=(1, 8), context=16, repeats=3)
    assert len(table.replicates()) == 40
    costs = write_costs(table, tmp_path / "c.yaml")
    r = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "rep"), "--feature", "q_max",
                                 "--costs", str(costs)])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["simulation"]["cost_refits"] == 40
    assert all("cost_ci95" in p for p in report["simulation"]["points"] if "[engine rule]" not in p["policy"])
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "x best fixed K (95 %, cost fit)" in md and "40 bootstrap refits" in md
    fig = PLOTS["pareto"](report)
    assert any(type(c).__name__ == "ErrorbarContainer" for c in fig.axes[0].containers)
    assert "40 refits of the cost model" in fig._supxlabel.get_text().replace("\n", " ")
    assert problems(fig) == []


def test_the_verdict_is_on_the_decisions_each_winner_counted_over_the_refits():
    """Issue 63: the report says whether the replay's winner at each B holds over the refits. Refits
    equal to the table agree everywhere; refits that make drafting dear or cheap change the winner
    at some B, and the audit counts them exactly as a replay of each refit picks them, names the
    rivals and the cells they differ on."""
    from svt.simulate.av import decision_audit, winners

    trace = _trace()
    same = _table((1.0,) * 4, (1.0,) * 4)
    points = replay(trace, same, concurrency=(1, 4, 16))
    got: list = []
    cost_intervals(trace, same, points, decisions=got)
    assert [d["in_doubt"] for d in got] == [False, False, False] and all(d["agree"] == 4 for d in got)
    assert [d["winner"] for d in got] == [winners(points)[b] for b in (1, 4, 16)]
    assert all(p != "oracle" for p in winners(points).values())
    # drafting 20x dearer in half the refits: the cheap-draft winner is not the dear-draft one at some B
    scales = (1.0, 1.0, 20.0, 20.0, 1.0, 20.0)
    moved = _table((1.0,) * 6, scales)
    points = replay(trace, moved, concurrency=(1, 4, 16))
    got = []
    cost_intervals(trace, moved, points, decisions=got)
    per_refit = [winners(replay(trace, r, concurrency=(1, 4, 16))) for r in moved.replicates()]
    refit_points = [replay(trace, r, concurrency=(1, 4, 16)) for r in moved.replicates()]
    for d in got:
        c = d["concurrency"]
        assert d["agree"] == sum(w[c] == d["winner"] for w in per_refit)
        assert d["agree"] + sum(d["others"].values()) == 6
        # within 2 % of each refit's best, counted from the refits' own replays
        best = [max(p["throughput"] for p in pts if p["concurrency"] == c and p["policy"] != "oracle")
                for pts in refit_points]
        mine = [next(p["throughput"] for p in pts if p["concurrency"] == c and p["policy"] == d["winner"])
                for pts in refit_points]
        assert d["within"] == sum(m >= 0.98 * b - 1e-9 for m, b in zip(mine, best, strict=True))
        assert d["within"] >= d["agree"]
        assert d["in_doubt"] == (d["within"] < 0.95 * 6)
    doubt = [d for d in got if d["in_doubt"]]
    assert doubt, "drafting 20x dearer changes some winner"
    for d in doubt:
        assert d["cells"] and all(c["cell"].startswith(("draft_ms[", "verify ")) for c in d["cells"])
        assert all(f"[{d['concurrency']}]" in c["cell"] or f"verify {d['concurrency']} rows" in c["cell"]
                   for c in d["cells"])
    assert decision_audit(points, [], moved, trace.k)[0]["in_doubt"] is False  # no refits: nothing to doubt


def test_two_policies_within_the_noise_of_each_other_are_no_doubt():
    """A refit that prefers a rival by 1 % is no reason to doubt the pick (either costs nothing);
    one that prefers it by 10 % is. In doubt only when fewer than 95 % of the refits keep the pick
    within 2 % of their best."""
    from svt.simulate.av import decision_audit

    def pts(a, b):
        return [{"policy": "fixed K=2", "concurrency": 1, "throughput": a},
                {"policy": "fixed K=3", "concurrency": 1, "throughput": b},
                {"policy": "oracle", "concurrency": 1, "throughput": 10 * a}]

    costs = _table()
    close = [pts(100.0, 101.0)] * 19 + [pts(100.0, 110.0)]
    d = decision_audit(pts(100.0, 99.0), close, costs, 3)[0]
    assert (d["winner"], d["agree"], d["within"], d["in_doubt"]) == ("fixed K=2", 0, 19, False)
    assert d["others"] == {"fixed K=3": 20} and d["worst_regret"] == pytest.approx(10 / 110)
    far = [pts(100.0, 101.0)] * 18 + [pts(100.0, 110.0)] * 2
    d = decision_audit(pts(100.0, 99.0), far, costs, 3)[0]
    assert (d["within"], d["in_doubt"]) == (18, True)
    assert {c["cell"] for c in d["cells"]} == {
        "draft_ms[1][2]", "draft_ms[1][3]", "verify 1 rows x 3 tokens", "verify 1 rows x 4 tokens"}
