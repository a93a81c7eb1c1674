"""`svt evaluate --live`: live runs of svt's engine measured against the replay of the same policy
at the same batch size (decode tokens/s from the engine's own steps, the cost table's price of those
steps, rounds summarised), and the runs it cannot compare refused with one message."""

import json
import shutil

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svt.collect import collect
from svt.config import load_collect_config
from svt.errors import DataError
from svt.report import EvaluateOptions, evaluate
from svt.simulate import load_costs
from svt.simulate.steps import StepTrace, continuous_ticks
from svt.traces.io import open_run
from tests.conftest import ROOT, reseal

COSTS = ROOT / "configs" / "costs" / "h100-llama8b-eagle.yaml"


def _cfg(models_dir, **over):
    base = {"target": str(models_dir / "target"), "draft": str(models_dir / "draft-small"),
            "workloads": [str(ROOT / "data" / "workloads" / f"{w}.jsonl") for w in ("code", "prose")],
            "requests": 8, "batch_size": 3, "max_new_tokens": 20, "k": 3, "device": "cpu",
            "max_prompt_tokens": 96, "schedule": "continuous"}
    return load_collect_config(None, base={**base, **over})


@pytest.fixture(scope="module")
def runs(tmp_path_factory, models_dir):
    root = tmp_path_factory.mktemp("live")
    for name, over in (("k3", {}), ("k0", {"k": 0}), ("k1", {"k": 1})):
        collect(_cfg(models_dir, **over), root / name, progress=False)
    return root


def _report(runs, *lives):
    return evaluate([runs / "k3"], EvaluateOptions(features=["q_max"], costs=str(COSTS),
                                                   live=[str(runs / x) for x in lives]))


def test_each_live_run_beside_the_replays_point_for_its_policy(runs):
    rep = _report(runs, "k3", "k0", "k1", "k3")
    sim = rep["simulation"]
    assert sim["schedule"] == "continuous"
    by = {(p["policy"], p["concurrency"]): p for p in sim["points"]}
    costs = load_costs(str(COSTS))
    rows = sim["live"]["runs"]
    assert [r["policy"] for r in rows] == ["fixed K=3", "fixed K=0", "fixed K=1", "fixed K=3"]
    for r in rows:
        sched = open_run(r["run"]).scan("schedule").collect()
        tok_s = sched["emitted"].sum() / (sched["step_ms"].sum() / 1e3)
        assert r["live_tokens_per_s"] == pytest.approx(tok_s, rel=1e-9)
        assert r["prefill_s"] == pytest.approx(sched["prefill_ms"].sum() / 1e3, rel=1e-6)
        point = by[(r["policy"], 3)]
        assert r["replay_tokens_per_s"] == point["throughput"]
        assert r["ratio"] == pytest.approx(point["throughput"] / tok_s, rel=1e-9)
        # the cost table's price of the run's own steps, step by step
        k = int(r["policy"].split("=")[1])
        assert (sched["draft_passes"] == k).all()
        priced = sum(costs.draft(int(b), k) + float(costs.verify(int(t), rows=int(b)))
                     for b, t in zip(sched["batch_size"], sched["verify_tokens"], strict=True)) / 1e3
        assert r["table_s"] == pytest.approx(priced, rel=1e-9)
        assert r["table_vs_steps"] == pytest.approx(priced / (sched["step_ms"].sum() / 1e3), rel=1e-6)
        assert (sched["forward_ms"] < sched["draft_ms"] + sched["verify_ms"]).all()  # sampling, acceptance outside
        fwd = float(sched["forward_ms"].sum()) / 1e3  # the time inside the steps' model forwards
        assert r["step_vs_forwards"] == pytest.approx(sched["step_ms"].sum() / 1e3 / fwd, rel=1e-6)
        assert r["step_vs_forwards"] >= 1.0  # a step holds its forwards
        # at the run's speed: the table's forward cells brought to this run's own forwards (this model
        # table has no step_ms, so the whole price scales): the ratio times price over forwards
        assert r["ratio_at_run_speed"] == pytest.approx(r["ratio"] * priced / fwd, rel=1e-6)
        # interactivity: each request's tokens over the engine steps it decoded in, averaged
        steps = open_run(r["run"]).scan("steps").collect()
        ms = dict(zip(sched["tick"].to_list(), sched["step_ms"].to_list(), strict=True))
        per = [sum(g["emitted"]) / (sum(ms[t] for t in g["step"]) / 1e3)
               for g in steps.partition_by("request", as_dict=False)]
        assert r["live_interactivity"] == pytest.approx(float(np.mean(per)), rel=1e-6)
        # while requests wait (before the last admission) every slot is full; from it the batch drains
        last = sched.filter(sched["admitted"] > 0)["tick"].max()
        assert r["waiting_mean_batch"] == pytest.approx(float(sched.filter(sched["tick"] < last)["batch_size"].mean()))
        assert r["waiting_mean_batch"] == 3.0 and r["mean_batch"] < 3.0
        # the context its verify forwards attended: the mean cache width over its steps
        assert r["cache_width"] == pytest.approx(float(sched["verify_slots"].mean()))
    # the same point twice: a median and range over the rounds
    k3 = next(p for p in sim["live"]["points"] if p["policy"] == "fixed K=3")
    assert k3["rounds"] == 2 and k3["ratio"]["min"] == k3["ratio"]["max"] == pytest.approx(rows[0]["ratio"])
    # the rows of a plain-decoding run emit one token per step
    assert rows[1]["live_tokens_per_step"] == 1.0
    # the replay's occupancy is each policy's own: on the trace's run, its schedule as the engine ran it
    assert rows[0]["replay_mean_batch"] == pytest.approx(rows[0]["mean_batch"], rel=1e-12)
    assert rows[1]["replay_mean_batch"] == by[("fixed K=0", 3)]["mean_batch"]
    # plain decoding runs one step per token of each request's output: where both runs' requests
    # generated the same lengths, its replayed schedule is the live one, step for step
    lengths = [open_run(runs / x).scan("requests").sort("request").select(pl.col("output_ids").list.len()).collect()
               .to_series().to_list() for x in ("k3", "k0")]
    assert lengths[0] == lengths[1]
    assert rows[1]["replay_mean_batch"] == pytest.approx(rows[1]["mean_batch"], rel=1e-12)


def test_runs_the_live_comparison_cannot_use_are_refused(runs, tmp_path, models_dir):
    bare = tmp_path / "bare"
    shutil.copytree(runs / "k3", bare)
    shutil.rmtree(bare / "schedule")
    reseal(bare)
    with pytest.raises(DataError, match="has no `schedule` table"):
        evaluate([runs / "k3"], EvaluateOptions(features=["q_max"], costs=str(COSTS), live=[str(bare)]))
    resumed = tmp_path / "resumed"
    shutil.copytree(runs / "k1", resumed)
    meta = json.loads((resumed / "run.json").read_text())
    meta["schedule"]["resumed"] = True
    (resumed / "run.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="resumed after an interruption"):
        evaluate([runs / "k3"], EvaluateOptions(features=["q_max"], costs=str(COSTS), live=[str(resumed)]))
    collect(_cfg(models_dir, k=5, requests=3), tmp_path / "k5", progress=False)
    with pytest.raises(DataError, match="drafted K = 5, more than the evaluated run's K = 3"):
        evaluate([runs / "k3"], EvaluateOptions(features=["q_max"], costs=str(COSTS), live=[str(tmp_path / "k5")]))


def _naive_ticks(counts: list[int], B: int) -> dict[tuple[int, int], int]:
    """Tick by tick: free slots take the next requests in order; each running request does one step."""
    queue, running, tick, at = list(range(len(counts))), {}, 0, {}
    left = dict(enumerate(counts))
    while queue or running:
        while queue and len(running) < B:
            r = queue.pop(0)
            running[r] = 0
        for r in list(running):
            at[(r, running[r])] = tick
            running[r] += 1
            if running[r] == left[r]:
                del running[r]
        tick += 1
    return at


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 7), min_size=1, max_size=12), st.integers(1, 5), st.integers(0, 3))
def test_continuous_ticks_equal_a_slot_by_slot_simulation(counts, B, shift):
    req = np.repeat(np.arange(len(counts)), counts)
    step = np.concatenate([np.arange(c) * 2 + shift for c in counts])  # any increasing step numbers
    perm = np.random.default_rng(len(counts)).permutation(req.size)  # rows in any order
    trace = StepTrace(req[perm], step[perm], np.zeros(req.size, int), 1, {}, "continuous")
    got = continuous_ticks(trace, B)
    want = _naive_ticks(counts, B)
    rank = (step[perm] - shift) // 2
    assert [want[(int(r), int(s))] for r, s in zip(req[perm], rank, strict=True)] == got.tolist()


def test_a_damaged_schedule_table_is_refused_not_timed(runs, tmp_path):
    """A NaN step time, a step of 0 rows, or a schedule that disagrees with the steps table (a
    shard of another run's schedule copied in) is one message, never a tokens/s figure."""
    import polars as pl

    from svt.errors import SchemaError

    for name, edit, err, match in (
            ("nan", lambda f: f.with_columns(pl.when(pl.col("tick") == f["tick"][0]).then(float("nan"))
                                             .otherwise(pl.col("step_ms")).alias("step_ms")), SchemaError, "step_ms"),
            ("rows", lambda f: f.with_columns(pl.lit(0, pl.Int16).alias("batch_size")), SchemaError, "batch_size"),
            # the reader compares every tick with the steps logged at it (before --live's totals)
            ("other", lambda f: f.with_columns(pl.col("emitted") + 1), SchemaError,
             "the schedule and steps tables disagree: {n} tick")):  # every tick of the edited shard
        bad = tmp_path / name
        shutil.copytree(runs / "k1", bad)
        shard = sorted((bad / "schedule").glob("*.parquet"))[0]
        match = match.format(n=pl.read_parquet(shard).height)
        edit(pl.read_parquet(shard)).write_parquet(shard)
        reseal(bad)
        with pytest.raises(err, match=match):
            evaluate([runs / "k3"], EvaluateOptions(features=["q_max"], costs=str(COSTS), live=[str(bad)]))


def test_the_ratio_at_the_runs_speed_rescales_the_forward_cells_and_keeps_the_engines_work():
    """A table pricing each step 3 ms, 0.5 of it the engine's work outside the forwards (step_ms);
    the run's forwards took 3 ms a step where the table's forward cells say 2.5: at the run's speed
    the forward cells become the run's 6 ms over the two steps, step_ms stays 1 ms, so the replay's
    time is 7/6 of the table's and the ratio 6/7 of the raw one."""
    from svt.report.live import compare_live

    class Costs:
        def draft(self, b, k):
            return 1.0

        def verify(self, t, rows):
            return 2.0

        def step_overhead(self, b, k):
            return 0.5

    live = {"run": "r", "policy": "fixed K=1", "batch_size": 1, "live_tokens_per_s": 100.0, "forwards_s": 0.006,
            "decode_s": 0.01, "mean_batch": 1.0, "waiting_mean_batch": 1.0, "_steps": np.array([[1, 2, 1], [1, 2, 1]])}
    out = compare_live([live], [{"policy": "fixed K=1", "concurrency": 1, "throughput": 120.0, "tokens_per_step": 2.0}],
                       Costs())
    r = out["runs"][0]
    assert r["ratio"] == pytest.approx(1.2)
    assert r["table_s"] == pytest.approx(0.006) and r["table_vs_forwards"] == pytest.approx(0.005 / 0.006)
    assert r["ratio_at_run_speed"] == pytest.approx(1.2 * 6 / 7)
    assert out["points"][0]["ratio_at_run_speed"]["median"] == pytest.approx(1.2 * 6 / 7)
