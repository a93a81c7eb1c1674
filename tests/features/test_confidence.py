"""The `confidence` feature: a DSpark drafter's own confidence head, logged with every draft (the
drafts table's optional `confidence` column) and scored beside q_max by default where every run
carries it; refused by name where a run's drafter has none."""

import polars as pl
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from svt.traces.io import open_run
from tests.conftest import ROOT


def test_a_dspark_run_logs_its_confidence_head_and_the_report_scores_it(dspark_run):
    from svt.features import run_features
    from svt.report import EvaluateOptions
    from svt.report.evaluate import evaluate
    from svt.traces.io import carried_columns

    run = open_run(dspark_run)
    assert run.carries("drafts", "confidence")
    d = run.scan("drafts").collect()
    assert d["confidence"].null_count() == 0 and d["confidence"].is_between(0, 1).all()
    feats = list(run_features(carried_columns([dspark_run])))
    assert feats[-1] == "confidence"
    rep = evaluate([dspark_run], EvaluateOptions(features=feats, bootstrap=0))
    lab = d.filter(pl.col("label").is_not_null())
    got = rep["features"]["confidence"]
    assert got["auc"] == pytest.approx(roc_auc_score(lab["label"], lab["confidence"]), abs=1e-9)
    # a probability of acceptance already: log-loss is defined without a fit
    p = lab["confidence"].cast(pl.Float64).clip(1e-6, 1 - 1e-6).to_numpy()
    assert got["log_loss"] == pytest.approx(log_loss(lab["label"], p), rel=1e-6)
    # scored beside the draft's own q features on the same drafts
    assert rep["features"]["q_max"]["n"] == got["n"] == lab.height


def test_the_confidence_feature_on_a_run_without_the_column_is_one_clear_error(small_run, tmp_path):
    from typer.testing import CliRunner

    from svt.cli import app

    r = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "rep"), "--feature", "confidence"])
    assert r.exit_code != 0 and "Traceback" not in r.output
    msg = " ".join(r.output.split())
    assert "reads `confidence`, which these drafts do not carry" in msg and "confidence head" in msg
    assert not (tmp_path / "rep" / "report.json").exists()


def test_live_av_on_the_confidence_of_a_drafter_without_a_head_is_refused_before_any_work(dspark_run, models_dir,
                                                                                           tmp_path):
    from svt.collect import collect
    from svt.config import load_collect_config
    from svt.errors import ConfigError
    from svt.fit import fit_runs

    est = fit_runs([str(dspark_run)], "irls-online", feature="confidence")
    est.save(tmp_path / "fit.json")
    costs = ROOT / "configs" / "costs" / "h100-llama8b-eagle.yaml"
    base = {"target": str(models_dir / "target"), "draft": str(models_dir / "draft-large"),
            "workloads": [str(ROOT / "data" / "workloads" / "code.jsonl")], "requests": 2, "k": 3,
            "max_new_tokens": 8, "device": "cpu", "av": {"fit": str(tmp_path / "fit.json"), "costs": str(costs)}}
    with pytest.raises(ConfigError, match=r"scores the feature 'confidence', which reads `confidence`: only a "
                                          r"drafter with a confidence head .* does not"):
        collect(load_collect_config(None, base=base), tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "drafts").exists()


def test_runs_with_and_without_the_column_evaluate_and_fit_together_on_their_common_columns(dspark_run, small_run):
    """A DSpark run beside a draft-model run (as `make demo`'s drafters report reads them): the
    confidence column is dropped where not every run carries it, and the runs score and fit as one."""
    from svt.features import run_features
    from svt.fit import fit_runs
    from svt.report import EvaluateOptions
    from svt.report.evaluate import evaluate
    from svt.traces.io import carried_columns

    runs = [small_run, dspark_run]
    feats = list(run_features(carried_columns(runs)))
    assert "confidence" not in feats
    rep = evaluate(runs, EvaluateOptions(features=feats, bootstrap=0, by="run"))
    alone = [evaluate([r], EvaluateOptions(features=["q_max"], bootstrap=0))["features"]["q_max"]["n"] for r in runs]
    assert rep["features"]["q_max"]["n"] == sum(alone)
    est = fit_runs(runs, "logistic")
    assert est.training_["rows"] > 0
