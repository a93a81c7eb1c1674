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
    with pytest.raises(ConfigError, match="batch_size: 1"):
        collect(load_collect_config(None, base={**base, "batch_size": 2, "hvd": {"fit": str(fit), "tau": 1}}),
                tmp_path / "a", progress=False)
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
