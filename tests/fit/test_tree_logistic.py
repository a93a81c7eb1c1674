"""`svt fit --model tree-logistic`: a saved node predictor trained on a tree run's nodes, scored by
the tree report on the requests it held out and used there to grow trees."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from svt.errors import ConfigError, DataError
from svt.fit import Fitter, fit_runs
from svt.report import EvaluateOptions, evaluate
from svt.traces.io import open_run
from svt.trees.predictor import node_features
from tests.report.test_trees import COSTS, _collect


@pytest.fixture(scope="module")
def trees(tmp_path_factory, models_dir):
    root = tmp_path_factory.mktemp("tree-fit")
    return {"greedy": _collect(models_dir, root / "greedy", requests=8),
            "sampling": _collect(models_dir, root / "sampling", requests=4, max_new_tokens=24, temperature=1.0)}


@pytest.fixture(scope="module")
def fitted(trees, tmp_path_factory):
    path = tmp_path_factory.mktemp("fits") / "tree.json"
    fit_runs([trees["greedy"]], "tree-logistic", test_fraction=0.5, seed=1).save(path)
    return path


def _nodes(run):
    return open_run(run).scan("tree_drafts").collect().sort("request", "step", "node")


def _cols(frame):
    return {c: frame[c].to_numpy() for c in ("q_token", "q_max", "q_entropy", "path_prob", "depth", "rank")}


def test_fit_is_sklearns_logistic_on_the_training_requests(trees, fitted):
    fit = Fitter.load(fitted)
    trained = {r for _, r in fit.training_["train_request_ids"]}
    assert 0 < len(trained) < 8
    nodes = _nodes(trees["greedy"])
    train = nodes.filter(pl.col("request").is_in(sorted(trained)))
    ref = LogisticRegression(C=1.0, max_iter=2000).fit(node_features(_cols(train)), train["match"].to_numpy())
    held = nodes.filter(~pl.col("request").is_in(sorted(trained)))
    np.testing.assert_allclose(fit.predict(held), ref.predict_proba(node_features(_cols(held)))[:, 1], atol=1e-6)
    assert fit.label_ == "match (every node)" and fit.training_["rows"] == train.height


def test_the_tree_report_scores_a_fit_on_its_held_out_requests(trees, fitted):
    fit = Fitter.load(fitted)
    trained = {r for _, r in fit.training_["train_request_ids"]}
    report = evaluate([trees["greedy"]], EvaluateOptions(fits=[str(fitted)], costs=str(COSTS)))
    t = report["trees"]
    held = _nodes(trees["greedy"]).filter(~pl.col("request").is_in(sorted(trained)))
    assert t["coverage"].startswith(f"the {8 - len(trained)} requests")
    assert sum(r["nodes"] for r in t["by_depth"]) == held.height  # every table on the held-out requests
    row = next(c for c in t["calibration"] if c["predictor"] == "fit tree-logistic")
    assert row["n"] == held.height
    assert row["auc"] == pytest.approx(roc_auc_score(held["match"], fit.predict(held)), abs=1e-12)
    grown = {r["budget"]: r for r in t["replay"] if r["policy"] == "fit tree-logistic"}
    by_path = {r["budget"]: r for r in t["replay"] if r["policy"] == "path-prob"}
    assert grown.keys() == by_path.keys()
    whole = max(grown, key=lambda b: grown[b]["nodes_per_step"])  # the whole logged tree: one subtree for all
    assert grown[whole]["accepted_per_step"] == by_path[whole]["accepted_per_step"]
    assert any(r["policy"] == "fit tree-logistic" for r in t["end_to_end"])
    # grown by the fit's path product, not by the drafter's path probability
    from svt.report.trees import logged

    logs = logged(held)
    for n in (2, 4):
        acc, _ = logs.outcome(logs.top_n(logs.path_product(fit.predict(held)), n))
        assert grown[f"n={n}"]["accepted_per_step"] == pytest.approx(acc.mean())


def test_sampling_runs_learn_acceptance_given_tried(trees, tmp_path):
    fit = fit_runs([trees["sampling"]], "tree-logistic", test_fraction=0.0)
    assert fit.label_ == "accepted given tried"
    tried = _nodes(trees["sampling"]).filter(pl.col("label").is_not_null())
    assert fit.training_["rows"] == _nodes(trees["sampling"]).height
    assert fit.training_["node_rate"] == pytest.approx(tried["label"].mean())
    with pytest.raises(DataError, match="mix greedy and sampling"):
        fit_runs([trees["greedy"], trees["sampling"]], "tree-logistic")
    path = tmp_path / "s.json"
    fit.save(path)
    greedy_fit = tmp_path / "g.json"
    fit_runs([trees["greedy"]], "tree-logistic").save(greedy_fit)
    with pytest.raises(DataError, match="sampling run does not have"):
        evaluate([trees["sampling"]], EvaluateOptions(fits=[str(greedy_fit)]))
    with pytest.raises(DataError, match="hold out 0 of this run's 4 requests"):  # trained on every request
        evaluate([trees["sampling"]], EvaluateOptions(fits=[str(path)]))
    half = tmp_path / "half.json"
    fit_runs([trees["sampling"]], "tree-logistic", test_fraction=0.5).save(half)
    report = evaluate([trees["sampling"]], EvaluateOptions(fits=[str(half)]))
    assert report["trees"]["coverage"].startswith("the 2 requests")
    row = next(c for c in report["trees"]["calibration"] if c["predictor"] == "fit tree-logistic")
    assert row["label"] == "accepted given tried" and report["trees"]["replay"] is None


def test_fits_and_runs_of_the_wrong_kind_are_refused(trees, fitted, small_run, tmp_path):
    with pytest.raises(DataError, match="not a tree run"):
        fit_runs([small_run], "tree-logistic")
    with pytest.raises(DataError, match="node predictor for draft trees"):
        evaluate([small_run], EvaluateOptions(fits=[str(fitted)]))
    chain_fit = tmp_path / "chain.json"
    fit_runs([small_run], "logistic").save(chain_fit)
    with pytest.raises(DataError, match="not a node predictor"):
        evaluate([trees["greedy"]], EvaluateOptions(fits=[str(chain_fit)]))
    d = json.loads(fitted.read_text())
    d["coef"] = d["coef"][:-1]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="coef"):
        Fitter.load(bad)
