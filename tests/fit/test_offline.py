"""Offline fitters against scikit-learn; fit files; `svt fit` and `svt evaluate --fit`."""

import json

import numpy as np
import pytest
from scipy.special import expit
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression
from typer.testing import CliRunner

from svt.cli import app
from svt.errors import ConfigError, DataError
from svt.fit import Fitter, fit_runs, get_fitter
from svt.fit.logistic import design, fit_newton

from ..conftest import reseal, steps_agreeing


@pytest.mark.parametrize("per_position_slope", [False, True])
def test_newton_matches_sklearn_unpenalised(per_position_slope):
    rng = np.random.default_rng(0)
    n, k = 20_000, 5
    f = rng.normal(0, 1.5, (n, 2))
    pos = rng.integers(0, k, n)
    z = 0.6 * f[:, 0] - 0.3 * f[:, 1] + np.linspace(0.5, -0.5, k)[pos]
    y = (rng.random(n) < expit(z)).astype(float)
    X = design(f, pos, k, per_position_slope=per_position_slope)
    beta, _ = fit_newton(X, y)
    ref = LogisticRegression(C=np.inf, fit_intercept=False, tol=1e-12, max_iter=10_000).fit(X, y)
    np.testing.assert_allclose(beta, ref.coef_[0], atol=1e-4)


def test_fits_on_a_real_run(small_run, tmp_path):
    lg = fit_runs([small_run], "logistic")
    assert isinstance(lg.to_dict()["slope"], float) and len(lg.intercepts_) == 4
    pp = fit_runs([small_run], "logistic", per_position_slope=True)
    assert len(pp.to_dict()["slope"]) == 4
    on = fit_runs([small_run], "irls-online")
    assert on.training_["evaluation"] == "prequential" and on.to_dict()["path"]
    iso = fit_runs([small_run], "isotonic")
    assert np.all(np.diff(iso.to_dict()["y_thresholds"]) >= 0)
    sts = fit_runs([small_run], "sts")
    assert all(t > 0 for t in sts.to_dict()["temperatures"])


@pytest.mark.parametrize(("model", "options"), [
    ("logistic", {}), ("logistic", {"per_position_slope": True}),
    ("logistic", {"features": ["logit_qmax", "entropy"], "per_position_slope": True}),
    ("irls-online", {}), ("irls-online", {"per_position_slope": True}), ("sts", {}), ("platt", {}),
    ("isotonic", {}),
])
def test_a_fit_saved_and_loaded_is_the_same_estimator(small_run, tmp_path, model, options):
    """fit_runs returns the fitter; save then Fitter.load gives the same class, the same file
    content (coefficients, training, version) and the same predictions."""
    from svt.fit import PredictContext, load_drafts_for_fit

    fit = fit_runs([small_run], model, **options)
    path = fit.save(tmp_path / "f.json")
    assert fit.file_ == path
    loaded = Fitter.load(path)
    assert type(loaded) is type(fit) and loaded.file_ == path
    assert loaded.record() == fit.record() == json.loads(path.read_text())
    assert loaded.training_ == fit.training_ and loaded.created_ == fit.created_
    drafts, _ = load_drafts_for_fit([small_run])
    ctx = PredictContext(runs=[small_run])
    np.testing.assert_allclose(loaded.predict(drafts, ctx), fit.predict(drafts, ctx), rtol=1e-12)
    with pytest.raises(ConfigError, match="not a sts fit" if model != "sts" else "not a platt fit"):
        (get_fitter("platt") if model == "sts" else get_fitter("sts")).load(path)


def test_an_unfitted_fitter_is_not_saved(tmp_path):
    with pytest.raises(ConfigError, match="has not been fitted"):
        get_fitter("logistic")().save(tmp_path / "f.json")
    assert not (tmp_path / "f.json").exists()


def test_isotonic_is_sklearns(small_run):
    import polars as pl

    from svt.fit import load_drafts_for_fit, split_mask

    iso = fit_runs([small_run], "isotonic", test_fraction=0.25, seed=3)
    d, _ = load_drafts_for_fit([small_run])
    train = d.filter(~pl.Series(split_mask(d, 0.25, 3)) & pl.col("label").is_not_null())
    ref = IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1).fit(
        train["q_max"].to_numpy().astype(float), train["label"].to_numpy())
    np.testing.assert_allclose(iso.to_dict()["y_thresholds"], ref.y_thresholds_)


def test_bad_fit_files_and_mismatched_runs(tmp_path, small_run):
    with pytest.raises(ConfigError, match="not found"):
        Fitter.load(tmp_path / "none.json")
    (tmp_path / "x.json").write_text(json.dumps({"model": "magic"}))
    with pytest.raises(ConfigError, match="not an svt fit"):
        Fitter.load(tmp_path / "x.json")
    fit = fit_runs([small_run], "logistic")
    fit.intercepts_ = fit.intercepts_[:2]
    fit.training_["k"] = 2
    fit.save(tmp_path / "k2.json")
    from svt.report import EvaluateOptions, evaluate

    with pytest.raises(DataError, match="knows 2 draft positions"):
        evaluate([small_run], EvaluateOptions(features=["q_max"], fits=[str(tmp_path / "k2.json")]))
    with pytest.raises(ConfigError, match="known fitters"):
        fit_runs([small_run], "magic")


def test_an_online_fit_that_never_refits_says_so(small_run, tmp_path):
    """Found by a probe: --preset vllm --cycle-steps 4 (min_obs 50 labels per position per cycle)
    never refits on a small run, and svt fit said nothing; the coefficients are the preset's start."""
    args = ["fit", str(small_run), "--model", "irls-online", "--preset", "vllm", "--out", str(tmp_path / "v.json")]
    r = CliRunner().invoke(app, [*args, "--cycle-steps", "4"])
    assert r.exit_code == 0 and "WARNING: no refit moved the coefficients" in r.output, r.output
    assert "larger --cycle-steps" in r.output
    fit = Fitter.load(tmp_path / "v.json")
    assert np.all(fit.slope_ == 0.0) and np.all(fit.intercepts_ == 1.5)  # the vllm preset's start


def test_cli_fit_then_evaluate(small_run, tmp_path):
    r = CliRunner().invoke(app, ["fit", str(small_run), "--model", "irls-online", "--out", str(tmp_path / "o.json")])
    assert r.exit_code == 0 and "WARNING" not in r.output, r.output
    r = CliRunner().invoke(app, ["fit", str(small_run), "--model", "logistic", "--out", str(tmp_path / "l.json")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "rep"), "--feature", "q_max",
                                 "--fit", str(tmp_path / "o.json"), "--fit", str(tmp_path / "l.json")])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    online, offline = rep["features"]["irls-online(logit_qmax)"], rep["features"]["logistic(logit_qmax)"]
    assert online["n"] == rep["features"]["q_max"]["n"]  # prequential: every labelled draft
    assert 0 < offline["n"] < online["n"]  # held-out requests only
    assert online["log_loss"] is not None and online["lossless"] is True
    r = CliRunner().invoke(app, ["fit", str(small_run), "--model", "logistic", "--by", "workload",
                                 "--out", str(tmp_path / "wl")])
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "wl" / "summary.json").read_text())
    assert {g["group"] for g in summary["groups"]} == {"code", "prose", "structured"}


def test_one_class_and_empty_data_are_refused(small_run, tmp_path):
    import polars as pl

    from svt.traces import open_run, write_meta, write_shard

    run = open_run(small_run)
    path = tmp_path / "allaccepted"
    # every draft accepted makes steps emit more than the outputs hold: written as a hand-made import
    # (an import keeps its source's steps), not as a run svt's engine collected
    write_meta(path, {**run.meta, "engine": "import", "import": {"format": "hand-edited"}})
    drafts = run.scan("drafts").with_columns(
        pl.when(pl.col("label").is_not_null()).then(pl.lit(1, pl.Int8)).alias("label")).collect()
    write_shard(path, "drafts", 0, drafts)
    write_shard(path, "steps", 0, steps_agreeing(drafts, run.scan("steps").collect()))
    write_shard(path, "requests", 0, run.scan("requests").collect())
    reseal(path)
    with pytest.raises(DataError, match="Only one class"):
        fit_runs([path], "irls-online")
    for model in ("logistic", "irls-online"):  # in memory, and streamed shard by shard
        with pytest.raises(DataError, match="after the filter"):
            fit_runs([small_run], model, where=pl.col("workload") == "nope")


def _frame(n=30_000, seed=0, k=4):
    rng = np.random.default_rng(seed)
    q = rng.uniform(0.02, 0.98, n)
    pos = rng.integers(0, k, n)
    t_true = np.array([0.7, 1.0, 1.6, 2.5])[pos]  # per-position temperatures
    z = np.log(q / (1 - q)) / t_true + np.array([0.3, 0.0, -0.2, -0.5])[pos]
    y = (rng.random(n) < expit(z)).astype(np.int8)
    import polars as pl

    return pl.DataFrame({"q_max": q.astype(np.float32), "position": pos.astype(np.int16), "label": y})


def test_sts_platt_and_per_position_slopes_against_sklearn():
    from svt.fit import FitData, get_fitter

    f = _frame()
    k = 4
    q = f["q_max"].to_numpy().astype(np.float64)
    z = np.log(q / (1 - q))
    y = f["label"].to_numpy()
    pos = f["position"].to_numpy()
    # sts: p = sigmoid(logit(q) / T_position), T_position = 1 / (sklearn's slope without intercept)
    sts = get_fitter("sts").from_options(feature="q_max").fit(FitData(f, k))
    for kk in range(k):
        m = pos == kk
        a = LogisticRegression(C=np.inf, fit_intercept=False, tol=1e-12, max_iter=10_000).fit(z[m, None], y[m])
        assert sts.temperatures_[kk] == pytest.approx(1 / a.coef_[0, 0], rel=2e-3)
    np.testing.assert_allclose(sts.predict(f), expit(z / sts.temperatures_[pos]), rtol=1e-9)
    # platt: p = sigmoid(a * q + b)
    platt = get_fitter("platt").from_options(feature="q_max").fit(FitData(f, k))
    ref = LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000).fit(q[:, None], y)
    np.testing.assert_allclose(platt.predict(f), ref.predict_proba(q[:, None])[:, 1], atol=1e-6)
    # per-position slopes: predictions equal scikit-learn's on the same design
    lg = get_fitter("logistic").from_options(feature="logit_qmax", per_position_slope=True).fit(FitData(f, k))
    X = design(z[:, None], pos, k, per_position_slope=True)
    ref = LogisticRegression(C=np.inf, fit_intercept=False, tol=1e-12, max_iter=10_000).fit(X, y)
    np.testing.assert_allclose(lg.predict(f), ref.predict_proba(X)[:, 1], atol=1e-6)
    assert np.ptp(lg.slope_) > 0.3  # the slopes do differ by position here
