"""Live HVD: greedy output equals plain greedy decoding token for token, its cache rows equal
`svt cache`'s, and its cycles equal the replay of the same fit and τ exactly."""

import json

import polars as pl
import pytest

from svt.collect import collect
from svt.config import load_collect_config
from svt.errors import ConfigError
from svt.fit import fit_runs
from svt.simulate.costs import CostTable
from svt.simulate.hvd import HVDRequest, replay_hvd
from svt.traces.io import open_run

from ..conftest import ROOT


@pytest.fixture(scope="module")
def batch1(tmp_path_factory, models_dir):
    base = {"target": str(models_dir / "target"), "draft": str(models_dir / "draft-large"),
            "workloads": [str(ROOT / "data" / "workloads" / f"{w}.jsonl") for w in ("structured", "code")],
            "requests": 6, "batch_size": 1, "max_new_tokens": 40, "k": 4, "device": "cpu", "temperature": 0,
            "max_prompt_tokens": 192, "cache": True}
    d = tmp_path_factory.mktemp("hvd")
    collect(load_collect_config(None, base=base), d / "greedy", progress=False)
    # the switching fit learns on other prompts: the live run's texts are then new to it, and its
    # report may score it (on the greedy run's own texts it would score its training data)
    later = []  # rows 20.. of the same workloads: the same kind of text, other prompts
    for w in ("structured", "code"):
        rows = (ROOT / "data" / "workloads" / f"{w}.jsonl").read_text().splitlines()[20:26]
        (d / f"{w}-later.jsonl").write_text("\n".join(rows) + "\n")
        later.append(str(d / f"{w}-later.jsonl"))
    train = {**base, "workloads": later}
    collect(load_collect_config(None, base=train), d / "train", progress=False)
    fit = fit_runs([d / "train"], "yield-linear", test_fraction=0.0).save(d / "yield.json")
    return base, d, fit


def _replayed_cycles(run, fit_path, tau, k):
    from svt.fit import Fitter
    from svt.fit.yield_data import load_cache_drafts_for_fit

    rows, _ = load_cache_drafts_for_fit([run], with_empty=True)
    pred = Fitter.load(fit_path).predict(rows)
    reqs, preds = [], []
    for (_, _), part in rows.with_columns(pl.Series("_p", pred)).group_by("_run", "request", maintain_order=True):
        reqs.append(HVDRequest("w", part["draft_len"].to_numpy(), part["oracle_accepted"].to_numpy(),
                               part["model_accepted"].to_numpy(), part["lookup_ms"].to_numpy()))
        preds.append(part["_p"].to_numpy())
    costs = CostTable("measured", draft_ms={1: {1: 1.0}}, verify_ms={1: 1.0, 2: 1.5})
    out = replay_hvd(reqs, {"p": preds}, k, costs, taus=(tau,))
    return next(r for r in out if r["group"] == "all" and r.get("predictor") == "p")["cycles"]


@pytest.mark.parametrize("tau", [0.5, 2.0])
def test_live_hvd_is_greedy_and_equals_its_replay(batch1, tau):
    base, d, fit = batch1
    live = d / f"live-{tau}"
    collect(load_collect_config(None, base={**base, "hvd": {"fit": str(fit), "tau": tau}}), live, progress=False)
    g = open_run(d / "greedy").scan("requests").sort("request").collect()
    h = open_run(live).scan("requests").sort("request").collect()
    assert g["output_ids"].to_list() == h["output_ids"].to_list()  # the greedy run equals plain greedy decoding
    meta = json.loads((live / "run.json").read_text())["hvd"]
    assert 0 < meta["cache_cycles"] < meta["cycles"]  # both sources were used
    assert meta["cycles"] == _replayed_cycles(d / "greedy", fit, tau, base["k"])
    cg = open_run(d / "greedy").scan("cache_drafts").sort("request", "decode_pos").collect().drop("lookup_ms")
    ch = open_run(live).scan("cache_drafts").sort("request", "decode_pos").collect().select(cg.columns)
    assert cg.equals(ch)
    steps = open_run(live).scan("steps").collect()
    assert steps["emitted"].sum() == meta["tokens"] == h["output_ids"].list.len().sum()
    # the model drafter's drafts in model cycles carry labels up to the first rejection
    dr = open_run(live).scan("drafts").collect()
    assert dr["label"].null_count() == 0 and set(dr["label"].unique()) <= {0, 1}
    if tau == 2.0:  # evaluated, it is not taken for a complete run: no AV replay over HVD cycles
        from svt.report import EvaluateOptions, evaluate

        rep = evaluate([live], EvaluateOptions(features=["q_max"], fits=[str(fit)],
                                               costs=str(ROOT / "configs" / "costs" / "h100-llama8b-eagle.yaml")))
        assert rep["simulation"] is None and rep["runs"][0]["labels"].startswith("live HVD run")
        assert rep["runs"][0]["experiment"]["engine"] == "svt live HVD"


def test_live_hvd_config_errors(batch1, tmp_path):
    base, d, fit = batch1
    with pytest.raises(ConfigError, match="schedule"):
        load_collect_config(None, base={**base, "batch_size": 2, "schedule": "continuous",
                                        "hvd": {"fit": str(fit), "tau": 1}})
    acc = fit_runs([d / "greedy"], "logistic", test_fraction=0.0).save(tmp_path / "acc.json")
    with pytest.raises(ConfigError, match="yield fit"):
        collect(load_collect_config(None, base={**base, "hvd": {"fit": str(acc), "tau": 1}}), tmp_path / "b",
                progress=False)
    with pytest.raises(ConfigError, match="temperature"):
        load_collect_config(None, base={**base, "temperature": 1.0, "cache": None, "hvd": {"fit": "f", "tau": 1}})
    # issue 23: live HVD ignored these while recording them in run.json
    for extra, words in (({"log": {"hidden": True}}, "log.hidden"), ({"log": {"dists_fraction": 0.5}}, "dists_fraction"),
                         ({"cache": False}, "`cache`")):
        with pytest.raises(ConfigError, match=words):
            load_collect_config(None, base={**base, **extra, "hvd": {"fit": str(fit), "tau": 1}})


def _batched_cfg(base, fit, models_dir, drafter):
    return {**base, "draft": str(models_dir / drafter), "batch_size": 3, "hvd": {"fit": str(fit), "tau": 0.5}}


@pytest.fixture(scope="module", params=["draft-large", "eagle3", "mtp", "dspark"])
def batched(request, batch1, models_dir):
    base, d, fit = batch1
    live = d / f"batched-{request.param}"
    collect(load_collect_config(None, base=_batched_cfg(base, fit, models_dir, request.param)), live, progress=False)
    return live, request.param


def test_live_hvd_in_batches(batch1, batched, tmp_path):
    """Issue 63: rows of a batch switch on their own, with a draft model or a hidden-state head.
    Greedy output equals plain greedy decoding; the cache rows logged live equal `svt cache`
    recomputed on the live run's own steps (the global tree filled in the order its requests
    finished); the cycles equal the replay of those rows; the model drafter's accepted lengths
    equal its teacher-forced ones, whatever the cache rows verified at the steps before."""
    from svt.collect.add_cache import add_cache_to_run

    base, d, fit = batch1
    tau = 0.5
    live, _ = batched
    g = open_run(d / "greedy").scan("requests").sort("request").collect()
    h = open_run(live).scan("requests").sort("request").collect()
    assert g["output_ids"].to_list() == h["output_ids"].to_list()
    meta = json.loads((live / "run.json").read_text())
    assert meta["batches"] == 2 and meta["hvd"]["batch_size"] == 3
    assert 0 < meta["hvd"]["cache_cycles"] < meta["hvd"]["cycles"]
    # a model cycle is one whose drafts the drafts table holds
    model = open_run(live).scan("drafts").select("request", "step").unique().collect().with_columns(
        pl.lit("model").alias("source"))
    steps = open_run(live).scan("steps").collect().join(model, on=["request", "step"], how="left").with_columns(
        pl.col("source").fill_null("cache"))
    assert steps["batch_size"].max() == 3
    # both sources at one engine step: the rows of a batch switch on their own
    mixed = steps.with_columns((pl.col("request") // 3).alias("b")).group_by("b", "step").agg(
        pl.col("source").n_unique())
    assert mixed["source"].max() == 2
    # cycles: the model drafter's live acceptance is its teacher-forced one, the cache's its oracle's
    assert meta["hvd"]["cycles"] == _replayed_cycles(live, fit, tau, base["k"]) == steps.height
    rows = open_run(live).scan("cache_drafts").sort("request", "decode_pos").collect()
    # each cycle's row is the cache row at the position it started from
    pos = (steps.sort("request", "step").with_columns(
        (pl.col("emitted").cum_sum().over("request") - pl.col("emitted")).alias("decode_pos")))
    chk = pos.join(rows, on=["request", "decode_pos"])
    assert chk.height == steps.height
    want = pl.when(pl.col("source") == "model").then(pl.col("model_accepted")).otherwise(pl.col("oracle_accepted"))
    # (capped at the tokens the request had left, as the teacher-forced and oracle lengths are)
    left = pl.col("request").replace_strict(dict(zip(h["request"], h["output_ids"].list.len(), strict=True))) - pl.col("decode_pos")
    got = chk.select(pl.min_horizontal("accepted", left).alias("live"),
                     pl.min_horizontal(want, "drafted", left).alias("replayed"))
    assert (got["live"] == got["replayed"]).all()
    # `svt cache` on the live run rebuilds the same rows from its steps
    copy = tmp_path / "recached"
    import shutil

    shutil.copytree(live, copy)
    add_cache_to_run(copy, device="cpu")
    again = open_run(copy).scan("cache_drafts").sort("request", "decode_pos").collect()
    cols = [c for c in rows.columns if c != "lookup_ms"]
    assert again.select(cols).equals(rows.select(cols))


def test_an_interrupted_batched_hvd_run_resumes_with_the_same_global_tree(batch1, batched, models_dir, tmp_path,
                                                                          monkeypatch):
    """Killed after its first batch: --resume refills the global tree with the committed responses
    in the order they finished, so the next batch's cache rows and cycles are the uninterrupted run's."""
    import svt.collect.hvd_run as hvd_run

    base, d, fit = batch1
    live, drafter = batched
    if drafter != "draft-large":
        pytest.skip("one drafter is enough for the resume path")
    real, calls = hvd_run.commit_batch, []

    def dying(out_, meta, b, frames):
        real(out_, meta, b, frames)
        calls.append(b)
        raise KeyboardInterrupt

    monkeypatch.setattr(hvd_run, "commit_batch", dying)
    cfg = load_collect_config(None, base=_batched_cfg(base, fit, models_dir, drafter))
    with pytest.raises(KeyboardInterrupt):
        collect(cfg, tmp_path / "cut", progress=False)
    monkeypatch.setattr(hvd_run, "commit_batch", real)
    assert collect(cfg, tmp_path / "cut", progress=False, resume=True).resumed_batches == 1
    a = open_run(tmp_path / "cut").scan("cache_drafts").sort("request", "decode_pos").collect().drop("lookup_ms")
    b = open_run(live).scan("cache_drafts").sort("request", "decode_pos").collect().drop("lookup_ms")
    assert a.select(b.columns).equals(b)
    assert a["from_global"].filter(a["request"] >= 3).any()  # the next batch did read the refilled tree
    meta = json.loads((tmp_path / "cut" / "run.json").read_text())["hvd"]
    assert meta["cycles"] == json.loads((live / "run.json").read_text())["hvd"]["cycles"]


def test_live_hvd_stands_among_the_live_points(batch1, batched):
    """Issue 63: a batched live-HVD run logs its engine steps (`schedule`) and `svt evaluate --live`
    reports its measured throughput and interactivity, and the cost table's price of its own steps,
    beside the other live runs (the AV replay has no HVD policy to predict it)."""
    from svt.report import EvaluateOptions, evaluate

    _, d, _ = batch1
    live, drafter = batched
    if drafter != "eagle3":
        pytest.skip("one drafter is enough for the report")
    sched = open_run(live).scan("schedule").collect()
    steps = open_run(live).scan("steps").collect()
    assert sched["batch_size"].sum() == steps.height and sched["emitted"].sum() == steps["emitted"].sum()
    assert (sched["step_ms"] >= sched["draft_ms"] + sched["verify_ms"] - 1e-3).all()
    # a step with no model row runs no drafter pass; one with any runs K
    model = open_run(live).scan("drafts").select("request", "step").unique().collect()
    assert set(sched["draft_passes"].unique()) <= {0, 4}
    costs = ROOT / "configs" / "costs" / "h100-llama8b-eagle.yaml"
    rep = evaluate([d / "greedy"], EvaluateOptions(features=["q_max"], costs=str(costs), live=[str(live)]))
    row = rep["simulation"]["live"]["runs"][0]
    assert row["policy"] == "live HVD tau=0.5" and row["replay_tokens_per_s"] is None and row["ratio"] is None
    assert row["live_tokens_per_s"] == pytest.approx(sched["emitted"].sum() / (sched["step_ms"].sum() / 1e3), rel=1e-6)
    # interactivity: a request decodes in its static batch's ticks up to its last step
    per = []
    for b, rs in enumerate(([0, 1, 2], [3, 4, 5])):
        part = open_run(live).parts("schedule")[b].collect()  # batch b's shard: its ticks from 0
        ms = dict(zip(part["tick"].to_list(), part["step_ms"].to_list(), strict=True))
        for r in rs:
            g = steps.filter(pl.col("request") == r)
            per.append(g["emitted"].sum() / (sum(ms[t] for t in g["step"]) / 1e3))
    assert row["live_interactivity"] == pytest.approx(sum(per) / len(per), rel=1e-6)
    assert row["table_vs_steps"] > 0 and model.height > 0
