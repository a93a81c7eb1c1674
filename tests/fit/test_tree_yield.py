"""Tree yield fitters (`tree-yield-linear`, `-gbm`, `-mlp`): trained on the positions with a tree
cache draft, scored on held-out requests, and switching HVD on tree drafts in `svt evaluate`."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from sklearn.linear_model import Ridge

from svt.errors import ConfigError
from svt.features.cache import TREE_FEATURES, YIELD_FEATURES, get_cache_features
from svt.fit import Fitter, fit_runs
from svt.fit.yield_data import load_cache_drafts_for_fit, load_cache_trees, tree_positions
from svt.report import EvaluateOptions, evaluate
from tests.conftest import ROOT

COSTS = ROOT / "configs" / "costs" / "h100-llama8b-eagle.yaml"


@pytest.fixture(scope="module")
def tree_fit(greedy_run, tmp_path_factory):
    path = tmp_path_factory.mktemp("tree-yield") / "tyl.json"
    fit_runs([greedy_run], "tree-yield-linear", test_fraction=0.5, seed=2).save(path)
    return path


def _positions(run):
    rows, _ = load_cache_drafts_for_fit([run], with_empty=True)
    return tree_positions(rows, load_cache_trees([run], rows))


def test_tree_yield_linear_is_ridge_on_the_training_trees(greedy_run, tree_fit):
    fit = Fitter.load(tree_fit)
    assert fit.features == [*YIELD_FEATURES, *TREE_FEATURES]
    trained = {r for _, r in fit.training_["train_request_ids"]}
    pos = _positions(greedy_run)
    train = pos.filter(pl.col("request").is_in(sorted(trained)) & (pl.col("tree_size") > 0))
    assert fit.training_["rows"] == train.height
    X = train.select(get_cache_features(fit.features)).to_numpy()
    mean, std = X.mean(0), X.std(0) + 1e-9
    ref = Ridge(alpha=1e-3).fit((X - mean) / std, train["tree_yield"].to_numpy())
    held = pos.filter(~pl.col("request").is_in(sorted(trained)))
    Xh = held.select(get_cache_features(fit.features)).to_numpy()
    want = np.clip(ref.predict((Xh - mean) / std), 0, held["tree_size"].to_numpy())
    np.testing.assert_allclose(fit.predict(held), want, atol=1e-8)
    assert (fit.predict(held)[held["tree_size"].to_numpy() == 0] == 0).all()  # no tree: no yield
    # a tree cannot yield more tokens than it has nodes (whatever the chain's length)
    small = held.filter(pl.col("tree_size") > 0).with_columns(pl.lit(1).cast(pl.UInt32).alias("tree_size"))
    assert fit.predict(small).max() <= 1.0 and (small["draft_len"] > 1).any()


def test_evaluate_scores_tree_fits_and_switches_hvd_on_trees(greedy_run, tree_fit):
    fit = Fitter.load(tree_fit)
    trained = {r for _, r in fit.training_["train_request_ids"]}
    report = evaluate([greedy_run], EvaluateOptions(fits=[str(tree_fit)], costs=str(COSTS)))
    yl = report["cache_tree"]["yield"]
    assert yl["coverage"].startswith(f"the {12 - len(trained)} requests")
    held = _positions(greedy_run).filter(~pl.col("request").is_in(sorted(trained)) & (pl.col("tree_size") > 0))
    err = fit.predict(held) - held["tree_yield"].to_numpy()
    assert yl["predictors"]["tree-yield-linear"]["mse"] == pytest.approx(float(np.mean(err ** 2)))
    assert yl["predictors"]["tree score"]["n"] == held.height
    hv = report["hvd_tree"]
    assert hv["requests"] == 12 - len(trained)
    assert any(b["predictor"] == "tree-yield-linear" for b in hv["best"])
    # the chain yield section does not try to score a tree fit on chain drafts
    assert "tree-yield-linear" not in (report["yield"] or {}).get("predictors", {})


def test_chain_yield_fitters_refuse_tree_features(greedy_run):
    with pytest.raises(ConfigError, match="tree cache drafts"):
        fit_runs([greedy_run], "yield-linear", features=["match_len", "tree_size"])
