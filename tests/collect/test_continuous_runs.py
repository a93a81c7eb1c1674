"""Continuous batching through `svt collect`: batches committed in order while others decode, the
schedule the engine ran recorded (and reproduced exactly by the replay's continuous schedule),
greedy output equal to the static engine's, plain decoding (k = 0), and resume."""

import json

import numpy as np
import polars as pl
import pytest

from svt.collect import collect
from svt.config import load_collect_config
from svt.simulate.steps import StepTrace, step_groups
from svt.traces.io import open_run
from tests.conftest import ROOT


def _base(models_dir, **over):
    base = {"target": str(models_dir / "target"), "draft": str(models_dir / "draft-small"),
            "workloads": [str(ROOT / "data" / "workloads" / f"{w}.jsonl") for w in ("code", "prose")],
            "requests": 10, "batch_size": 3, "max_new_tokens": 24, "k": 3, "device": "cpu", "temperature": 0,
            "max_prompt_tokens": 96, "schedule": "continuous"}
    return {**base, **over}


@pytest.fixture(scope="module")
def continuous_greedy(tmp_path_factory, models_dir):
    out = tmp_path_factory.mktemp("runs") / "cont"
    collect(load_collect_config(None, base=_base(models_dir)), out, progress=False)
    return out


def test_a_continuous_run_records_its_schedule_and_decodes_the_static_runs_tokens(continuous_greedy, models_dir,
                                                                                   tmp_path):
    run = open_run(continuous_greedy)
    meta = json.loads((continuous_greedy / "run.json").read_text())
    assert meta["schedule"]["kind"] == "continuous" and meta["schedule"]["slots"] == 3
    sched = run.scan("schedule").collect().sort("tick")
    steps = run.scan("steps").collect()
    # one schedule row per engine step, committed once, in tick order across the batches' shards
    assert sched["tick"].to_list() == list(range(sched.height))
    per_tick = steps.group_by("step").agg(pl.len().alias("n"), pl.col("emitted").sum().alias("e")).sort("step")
    assert per_tick["step"].to_list() == sched["tick"].to_list()
    assert per_tick["n"].to_list() == sched["batch_size"].to_list()
    assert per_tick["e"].to_list() == sched["emitted"].to_list()
    waiting = (sched["admitted"].cum_sum() < 10).to_numpy()
    assert waiting.sum() > 3 and (sched["batch_size"].to_numpy()[waiting] == 3).all()
    # the same prompts through static batches: the same greedy tokens, request by request
    static = tmp_path / "static"
    collect(load_collect_config(None, base=_base(models_dir, schedule="static")), static, progress=False)
    a = run.scan("requests").collect().sort("request")
    b = open_run(static).scan("requests").collect().sort("request")
    assert a["output_ids"].to_list() == b["output_ids"].to_list()
    s_static = open_run(static).scan("schedule").collect()
    assert s_static["batch_size"].mean() < sched["batch_size"].mean()  # static batches drain


def test_the_replays_continuous_schedule_is_the_engines(continuous_greedy):
    """Grouping a continuous run's request-steps by the replay's continuous schedule at the run's
    batch size gives exactly the engine's steps (the same rows at every tick)."""
    steps = open_run(continuous_greedy).scan("steps").collect().sort("request", "step")
    trace = StepTrace(steps["request"].to_numpy(), steps["step"].to_numpy(), steps["accepted"].to_numpy(), 3, {},
                      "continuous")
    groups = step_groups(trace, 3)
    ticks = steps["step"].to_numpy()
    assert len(groups) == np.unique(ticks).size
    for g in groups:
        assert np.unique(ticks[g]).size == 1
    got = [sorted(steps["request"].to_numpy()[g].tolist()) for g in groups]
    want = [sorted(steps.filter(pl.col("step") == t)["request"].to_list()) for t in np.unique(ticks)]
    assert got == want


def test_plain_decoding_runs_through_the_engine(models_dir, tmp_path, continuous_greedy):
    out = tmp_path / "k0"
    collect(load_collect_config(None, base=_base(models_dir, k=0)), out, progress=False)
    run = open_run(out)
    assert run.scan("drafts").collect().height == 0
    steps = run.scan("steps").collect()
    assert (steps["drafted"] == 0).all() and (steps["emitted"] == 1).all()
    sched = run.scan("schedule").collect()
    assert (sched["verify_tokens"] == sched["batch_size"]).all()
    a = run.scan("requests").collect().sort("request")["output_ids"].to_list()
    b = open_run(continuous_greedy).scan("requests").collect().sort("request")["output_ids"].to_list()
    assert a == b  # greedy plain decoding = greedy speculative decoding


def test_an_interrupted_continuous_run_resumes_from_its_first_uncommitted_batch(models_dir, tmp_path, monkeypatch,
                                                                                 continuous_greedy):
    """Killed after its second batch is committed: --resume keeps the committed batches, redoes the
    rest continuously, and ends with the same greedy tokens and one schedule row per tick."""
    import svt.collect.runner as runner

    out = tmp_path / "cut"
    real = runner.commit_batch
    calls = []

    def dying(out_, meta, b, frames):
        real(out_, meta, b, frames)
        calls.append(b)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(runner, "commit_batch", dying)
    cfg = load_collect_config(None, base=_base(models_dir))
    with pytest.raises(KeyboardInterrupt):
        collect(cfg, out, progress=False)
    assert calls == [0, 1]  # in order
    monkeypatch.setattr(runner, "commit_batch", real)
    summary = collect(cfg, out, progress=False, resume=True)
    assert summary.resumed_batches == 2
    run = open_run(out)
    a = run.scan("requests").collect().sort("request")["output_ids"].to_list()
    b = open_run(continuous_greedy).scan("requests").collect().sort("request")["output_ids"].to_list()
    assert a == b
    steps = run.scan("steps").collect()
    assert steps.select("request", "step").is_duplicated().sum() == 0
    ticks = run.scan("schedule").collect()["tick"]
    assert ticks.is_duplicated().sum() == 0  # the resumed session's steps come after the committed ones
    assert steps.filter(pl.col("request") >= 6)["step"].min() > run.scan("schedule").collect()["tick"].sort()[0]
    assert json.loads((out / "run.json").read_text())["schedule"]["resumed"] is True
