"""`svt evaluate` on a real small run, checked against scikit-learn on the same rows."""

import json

import numpy as np
import polars as pl
import pytest
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score
from typer.testing import CliRunner

from svt.cli import app
from svt.errors import DataError
from svt.report import EvaluateOptions, evaluate
from svt.traces import open_run, write_meta, write_shard

from ..conftest import outputs_agreeing, reseal, steps_agreeing

REQUIRED = ("lossless", "auc", "log_loss", "ece", "brier", "mean_pred", "accept_rate", "n")


def test_report_agrees_with_sklearn(small_run):
    rep = evaluate([small_run], EvaluateOptions(bootstrap=20))
    d = open_run(small_run).scan("drafts").filter(pl.col("label").is_not_null()).collect()
    y, q = d["label"].to_numpy(), d["q_max"].to_numpy().astype(np.float64)
    f = rep["features"]["q_max"]
    for key in REQUIRED:
        assert key in f
    assert f["auc"] == pytest.approx(roc_auc_score(y, q), abs=1e-9)
    assert f["log_loss"] == pytest.approx(log_loss(y, q), abs=1e-9)
    assert f["brier"] == pytest.approx(brier_score_loss(y, q), abs=1e-9)
    assert f["n"] == len(y) and f["accept_rate"] == pytest.approx(y.mean())
    lo, hi = f["ci95"]["auc"]
    assert lo <= f["auc"] <= hi
    m = d["position"].to_numpy() > 0
    assert f["excluding_first"]["auc"] == pytest.approx(roc_auc_score(y[m], q[m]), abs=1e-9)
    for pos, block in f["per_position"].items():
        mp = d["position"].to_numpy() == pos
        if len(set(y[mp])) == 2:
            assert block["auc"] == pytest.approx(roc_auc_score(y[mp], q[mp]), abs=1e-9)
        else:
            assert block["auc"] is None and "only one class" in block["reasons"]["auc"]
    # not a probability: undefined with the reason, never a made-up number
    lq = rep["features"]["logit_qmax"]
    assert lq["log_loss"] is None and "fitted predictor" in lq["reasons"]["log_loss"]
    assert lq["auc"] == pytest.approx(f["auc"], abs=1e-12)
    # soft labels
    soft = rep["features"]["q_max"]["soft"]["accept_prob_expected"]
    assert 0 < soft["auc"] < 1


def test_bias_is_zero_exactly_for_lossless_features(small_run):
    rep = evaluate([small_run])
    bias = rep["lossless_bias"]
    assert bias["q_max"]["positions"] > 10
    for name, row in bias.items():
        if row["lossless"]:
            assert row["max_bias"] == 0.0, name
        else:
            assert row["mean_bias"] > 1e-4, name


def test_by_workload_and_several_runs(small_run, tmp_path):
    import shutil

    other = tmp_path / "copy"
    shutil.copytree(small_run, other)
    with pytest.raises(DataError, match="same run"):  # a copy would be counted twice
        evaluate([small_run, other], EvaluateOptions(features=["q_max"]))
    with pytest.raises(DataError, match="given twice"):
        evaluate([small_run, small_run], EvaluateOptions(features=["q_max"]))
    meta = json.loads((other / "run.json").read_text())
    meta["run_id"] = "another"  # a second run (here with the same rows, to compare the groups)
    (other / "run.json").write_text(json.dumps(meta))
    rep = evaluate([small_run, other], EvaluateOptions(features=["q_max"], by="workload"))
    assert set(rep["groups"]["run"]) == {"small", "copy"}
    assert rep["groups"]["run"]["small"]["q_max"]["auc"] == pytest.approx(rep["groups"]["run"]["copy"]["q_max"]["auc"])
    assert set(rep["groups"]["workload"]) == {"code", "prose", "structured"}
    with pytest.raises(DataError, match="no such column"):
        evaluate([small_run], EvaluateOptions(by="colour"))


def test_no_labelled_drafts_is_an_error(small_run, tmp_path):
    run = open_run(small_run)
    path = tmp_path / "nolabels"
    write_meta(path, run.meta)
    drafts = run.scan("drafts").with_columns(pl.lit(None, pl.Int8).alias("label")).collect()
    write_shard(path, "drafts", 0, drafts)
    write_shard(path, "steps", 0, steps_agreeing(drafts, run.scan("steps").collect()))
    write_shard(path, "requests", 0, run.scan("requests").collect())
    outputs_agreeing(path)
    reseal(path)
    with pytest.raises(DataError, match="No labelled drafts"):
        evaluate([path])


def test_cli_writes_json_and_markdown(small_run, tmp_path):
    r = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "rep"),
                                 "--feature", "q_max", "--feature", "q_sampled"])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert set(rep["features"]) == {"q_max", "q_sampled"}
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Excluding the first draft position" in md and "| q_sampled | no |" in md
    r = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "x"), "--feature", "qmax"])
    assert r.exit_code == 2 and "known features" in r.output
    r = CliRunner().invoke(app, ["evaluate", str(tmp_path / "nope"), "--out", str(tmp_path / "y")])
    assert r.exit_code == 3 and "not a directory" in r.output


def test_evaluate_replaces_a_report_only_with_overwrite_and_never_a_run(small_run, tmp_path):
    """`svt evaluate` silently replaced an existing report; now it is --overwrite, as elsewhere."""
    rep = tmp_path / "rep"
    args = ["evaluate", str(small_run), "--feature", "q_max"]
    assert CliRunner().invoke(app, [*args, "--out", str(rep)]).exit_code == 0
    (rep / "fits").mkdir()  # a report folder holds fits and figures beside the report
    before = (rep / "report.json").read_text()
    r = CliRunner().invoke(app, [*args, "--out", str(rep), "--feature", "entropy"])
    assert r.exit_code == 2 and "already holds a report (report.json); pass --overwrite" in r.output
    assert (rep / "report.json").read_text() == before
    r = CliRunner().invoke(app, [*args, "--out", str(rep), "--overwrite"])
    assert r.exit_code == 0 and (rep / "fits").is_dir()
    r = CliRunner().invoke(app, [*args, "--out", str(small_run), "--overwrite"])
    assert r.exit_code == 2 and "is a run directory" in r.output and not (small_run / "report.json").exists()


def _recollected(run, out):
    """An identical re-collection of ``run`` under a new run id (what the same config and seed
    give again)."""
    import shutil

    shutil.copytree(run, out)
    meta = json.loads((out / "run.json").read_text())
    meta["run_id"] = "recollected0"
    (out / "run.json").write_text(json.dumps(meta))
    return out


def test_a_fit_scored_on_a_recollection_of_its_training_run_keeps_its_held_out_split(small_run, tmp_path):
    """Issue 23: a re-collection (new run id) was scored as unseen, so the fit's own training
    requests counted as held out."""
    from svt.fit import fit_runs

    fit = fit_runs([small_run], "logistic").save(tmp_path / "lr.json")
    opts = EvaluateOptions(features=["q_max"], fits=[str(fit)])
    own = evaluate([small_run], opts)["features"]["logistic(logit_qmax)"]
    again = evaluate([_recollected(small_run, tmp_path / "again")], opts)["features"]["logistic(logit_qmax)"]
    assert again["n"] == own["n"] < evaluate([small_run], EvaluateOptions(features=["q_max"]))["features"]["q_max"]["n"]
    assert again["auc"] == own["auc"]


def test_a_yield_fit_from_another_model_pair_is_refused(greedy_run, tmp_path):
    from svt.errors import DataError
    from svt.fit import fit_runs

    fit = fit_runs([greedy_run], "yield-linear").save(tmp_path / "y.json")
    other = _recollected(greedy_run, tmp_path / "other-pair")
    meta = json.loads((other / "run.json").read_text())
    meta["models"]["draft"]["weights_sha256_16"] = "0123456789abcdef"
    (other / "run.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="another model pair"):
        evaluate([other], EvaluateOptions(features=["q_max"], fits=[str(fit)]))
