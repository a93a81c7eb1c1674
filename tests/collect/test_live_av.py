"""Live AV in the collector: censored labels, exploration, refusal, and the live-vs-replay check."""

import json
from pathlib import Path

import polars as pl
import pytest
import yaml

from svt.collect import collect
from svt.config import load_collect_config
from svt.errors import SchemaError
from svt.fit import fit_runs
from svt.report import EvaluateOptions, evaluate
from svt.traces import open_run


@pytest.fixture(scope="module")
def av_files(small_run, tmp_path_factory):
    d = tmp_path_factory.mktemp("av")
    fit = fit_runs([small_run], "logistic", test_fraction=0.0).save(d / "fit.json")
    costs = d / "costs.yaml"  # verification expensive per token: trimming happens
    costs.write_text(yaml.safe_dump({"kind": "measured", "drafter": "autoregressive",
                                     "draft_ms": {1: {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4}, 8: {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4}},
                                     "verify_ms": {1: 1.0, 100: 100.0}}))
    return fit, costs


ROOT = Path(__file__).resolve().parents[2]


def _cfg(models_dir, fit, costs, explore):
    return load_collect_config(None, base={
        "target": str(models_dir / "target"), "draft": str(models_dir / "draft-large"),
        "workloads": [str(ROOT / "data" / "workloads" / "code.jsonl")], "requests": 8, "batch_size": 4,
        "max_new_tokens": 24, "k": 4, "device": "cpu",
        "av": {"fit": str(fit), "costs": str(costs), "explore": explore}})


def test_live_av_run_is_censored_and_refused_without_exploration(models_dir, av_files, tmp_path):
    fit, costs = av_files
    collect(_cfg(models_dir, fit, costs, 0.0), tmp_path / "run", progress=False)
    run = open_run(tmp_path / "run")
    steps = run.scan("steps").collect()
    assert (steps["kept"] < 4).any() and not steps["explored"].any()
    assert json.loads((tmp_path / "run" / "run.json").read_text())["av"]["explore"] == 0.0
    with pytest.raises(SchemaError, match="censored labels as complete"):
        evaluate([tmp_path / "run"], EvaluateOptions(features=["q_max"]))
    with pytest.raises(SchemaError, match="av.explore"):
        fit_runs([tmp_path / "run"], "logistic")


def test_explored_steps_are_used_and_the_live_check(models_dir, av_files, small_run, tmp_path):
    fit, costs = av_files
    collect(_cfg(models_dir, fit, costs, 0.5), tmp_path / "run", progress=False)
    steps = open_run(tmp_path / "run").scan("steps").collect()
    explored = steps.filter(pl.col("explored"))
    assert 0 < explored.height < steps.height and (explored["kept"] == 4).all()
    rep = evaluate([tmp_path / "run"], EvaluateOptions(features=["q_max"]))
    assert "explored steps" in rep["runs"][0]["labels"]
    d = open_run(tmp_path / "run").scan("drafts").join(explored.lazy().select("request", "step"),
                                                      on=["request", "step"], how="semi").collect()
    assert rep["features"]["q_max"]["n"] == d["label"].is_not_null().sum()
    # the replay runs on a complete trace of the same config (no AV), which the fit never saw
    full = _cfg(models_dir, fit, costs, 0.0)
    full.av = None
    collect(full, tmp_path / "full", progress=False)
    rep = evaluate([tmp_path / "full"], EvaluateOptions(features=["q_max"], fits=[str(fit)], costs=str(costs),
                                                        live=[str(tmp_path / "run")]))
    live = rep["simulation"]["live_check"]
    assert live["batch_size"] == 4 and live["trimmed_steps"] > 0
    trimmed = open_run(tmp_path / "run").scan("steps").filter(~pl.col("explored")).collect()
    assert live["live_tokens_per_step"] == pytest.approx(float((trimmed["accepted"] + 1).mean()), abs=1e-12)
    # the same predictor and costs on a trace of the same config: live and replay agree closely
    # (a live AV that trims everything would give 1 token per step against a replay of ~2)
    assert abs(live["gap"]) < 0.35, live
    # beside it, the live run's measured decode speed against the replay's for the same policy
    row = rep["simulation"]["live"]["runs"][0]
    assert row["policy"].startswith("AV ") and row["batch_size"] == 4
    sched = open_run(tmp_path / "run").scan("schedule").collect()
    assert row["live_tokens_per_s"] == pytest.approx(sched["emitted"].sum() / (sched["step_ms"].sum() / 1e3))


def test_online_estimator_learns_while_collecting_after_a_verified_warm_up(models_dir, av_files, small_run, tmp_path):
    from svt.fit.irls_online import OnlineOptions

    _, costs = av_files
    online = fit_runs([small_run], "irls-online", online=OnlineOptions(cycle_steps=2, warmup_refits=2, damping=50))
    fit = online.save(tmp_path / "online.json")
    cfg = _cfg(models_dir, fit, costs, 0.0)
    cfg.av.online = True
    collect(cfg, tmp_path / "run", progress=False)
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["av"]["online_refits"] >= 3
    path = meta["av"]["online_path"]
    assert path[0]["slope"] != [1.0]  # it moved from the initial w = 1
    steps = open_run(tmp_path / "run").scan("steps").sort("request", "step").collect()
    first_batch = steps.filter(pl.col("request") < 4)
    # warm-up: 2 refits x 2 engine steps verify every draft, then AV trims
    assert first_batch.filter(pl.col("step") < 4)["explored"].all()
    assert (steps.filter(~pl.col("explored"))["kept"] < 4).any()
    with pytest.raises(Exception, match="Cannot resume"):
        collect(cfg, tmp_path / "run", resume=True, progress=False)
