"""Every number the report computes outside the public metric functions, against an independent
computation: ECE (both binnings), soft-label blocks, bootstrap intervals, per-group tables,
expected-length calibration, mean acceptance length, and held-out scoring."""

import numpy as np
import polars as pl
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from svt.metrics import ece
from svt.metrics.ordered import bootstrap_intervals
from svt.report import EvaluateOptions, evaluate
from svt.traces import open_run


@pytest.fixture(scope="module")
def report(small_run):
    return evaluate([small_run], EvaluateOptions(features=["q_max"], by="workload"))


@pytest.fixture(scope="module")
def labelled(small_run):
    return open_run(small_run).scan("drafts").filter(pl.col("label").is_not_null()).collect()


def test_ece_both_binnings_equal_the_public_function(report, labelled):
    y, q = labelled["label"].to_numpy(), labelled["q_max"].to_numpy().astype(np.float64)
    f = report["features"]["q_max"]
    assert f["ece"] == pytest.approx(ece(y, q, n_bins=10), abs=1e-12)
    assert f["ece_mass"] == pytest.approx(ece(y, q, n_bins=10, strategy="mass"), abs=1e-12)
    m = labelled["position"].to_numpy() == 1
    assert f["per_position"][1]["ece"] == pytest.approx(ece(y[m], q[m]), abs=1e-12)


def test_soft_label_blocks_are_weighted_hard_labels(report, labelled):
    """A soft label t is a positive of weight t and a negative of weight 1 - t: scikit-learn on the
    rows duplicated that way gives the same AUC and log-loss."""
    q = labelled["q_max"].to_numpy().astype(np.float64)
    for soft in ("accept_prob", "accept_prob_expected"):
        t = labelled[soft].to_numpy().astype(np.float64)
        yy = np.r_[np.ones_like(t), np.zeros_like(t)]
        ss, ww = np.r_[q, q], np.r_[t, 1 - t]
        block = report["features"]["q_max"]["soft"][soft]
        # AUC counts distinct rows' pairs: take out each row paired with itself (a tie in sklearn)
        W, selfp = t.sum() * (1 - t).sum(), np.sum(t * (1 - t))
        sk = roc_auc_score(yy, ss, sample_weight=ww) * W
        assert block["auc"] == pytest.approx((sk - 0.5 * selfp) / (W - selfp), abs=1e-9)
        assert block["log_loss"] == pytest.approx(log_loss(yy, ss, sample_weight=ww), abs=1e-9)
        assert block["ece"] == pytest.approx(ece(t, q), abs=1e-12)


def test_per_group_tables_equal_the_subset(report, labelled):
    for w, block in report["groups"]["workload"].items():
        part = labelled.filter(pl.col("workload") == w)
        y, q = part["label"].to_numpy(), part["q_max"].to_numpy().astype(np.float64)
        assert block["q_max"]["n"] == part.height
        assert block["q_max"]["auc"] == pytest.approx(roc_auc_score(y, q), abs=1e-9)
        assert block["q_max"]["ece"] == pytest.approx(ece(y, q), abs=1e-12)


def test_mean_acceptance_length_and_length_calibration_by_a_slow_loop(report, small_run):
    d = open_run(small_run).scan("drafts").collect()
    steps = {}
    for r in d.iter_rows(named=True):
        key = (r["request"], r["step"])
        acc, surv, pred = steps.get(key, (0, 1.0, 0.0))
        surv *= r["q_max"]  # the survival of the rows up to this position (rows come in order)
        steps[key] = (acc + (r["label"] == 1), surv, pred + surv)
    accepted = np.array([v[0] for v in steps.values()], dtype=float)
    assert report["acceptance"]["mean_acceptance_length"] == pytest.approx(1 + accepted.mean(), abs=1e-12)
    lc = report["length_calibration"]["q_max"]
    assert lc["steps"] == len(steps)
    assert lc["mean_predicted"] == pytest.approx(np.mean([v[2] for v in steps.values()]), rel=1e-6)
    assert lc["mean_realised"] == pytest.approx(accepted.mean(), abs=1e-12)


def test_bootstrap_resamples_requests_not_rows():
    """A fixture where rows of one request are perfectly correlated: whole requests are either all
    accepted or all rejected. A request-level bootstrap sees 10 independent units (wide interval);
    a row-level one would see 2,000 (narrow). The interval matches a slow request-level reference."""
    rng = np.random.default_rng(0)
    n_req, per = 10, 200
    req = np.repeat(np.arange(n_req), per)
    y = np.repeat(rng.random(n_req) < 0.5, per).astype(float)
    s = np.clip(rng.normal(0.7, 0.15, req.size), 0.01, 0.99)  # the loss of a row depends on its label
    t = bootstrap_intervals(s, y.astype(np.int8), np.zeros(req.size, int), req, probability=True, n=400, seed=3)
    lo, hi = t["overall"]["log_loss"]
    # the slow reference: 400 draws of 10 requests with replacement
    ref = []
    gen = np.random.default_rng(11)
    for _ in range(400):
        pick = gen.integers(0, n_req, n_req)
        rows = np.concatenate([np.flatnonzero(req == r) for r in pick])
        ref.append(log_loss(y[rows], s[rows], labels=[0, 1]))
    rlo, rhi = np.percentile(ref, [2.5, 97.5])
    assert hi - lo == pytest.approx(rhi - rlo, rel=0.35)  # same spread (different random streams)
    row_level = []
    for _ in range(400):
        rows = gen.integers(0, req.size, req.size)
        row_level.append(log_loss(y[rows], s[rows], labels=[0, 1]))
    assert hi - lo > 3 * np.subtract(*np.percentile(row_level, [97.5, 2.5]))
    assert t["excluding_first"] == {}  # an empty scope: no interval, no crash


def test_offline_fit_is_scored_on_exactly_the_requests_it_did_not_train_on(small_run, tmp_path):
    from svt.fit import fit_runs

    fit = fit_runs([small_run], "logistic", test_fraction=0.4, seed=2)
    path = fit.save(tmp_path / "lg.json")
    trained = {r for _, r in fit.training_["train_request_ids"]}
    d = open_run(small_run).scan("drafts").filter(pl.col("label").is_not_null()).collect()
    held = d.filter(~pl.col("request").is_in(list(trained)))
    assert 0 < held.height < d.height
    rep = evaluate([small_run], EvaluateOptions(features=["q_max"], fits=[str(path)]))
    block = next(v for k, v in rep["features"].items() if k.startswith("logistic"))
    assert block["n"] == held.height
    from scipy.special import expit

    z = fit.to_dict()["slope"] * np.log(held["q_max"].to_numpy() / (1 - held["q_max"].to_numpy())) + \
        np.asarray(fit.to_dict()["intercepts"])[held["position"].to_numpy()]
    assert block["auc"] == pytest.approx(roc_auc_score(held["label"].to_numpy(), expit(z)), abs=1e-6)


def test_fitted_predictors_every_section_by_a_slow_loop(small_run, tmp_path):
    """A fitted predictor takes its own path through the report (joined predictions, only the rows
    it may be scored on, its own length calibration): each of its numbers against a computation
    from the fit's predictions on the drafts, step by step in plain Python."""
    from svt.fit import Fitter, PredictContext, fit_runs, load_drafts_for_fit

    paths = {m: fit_runs([small_run], m).save(tmp_path / f"{m}.json") for m in ("logistic", "irls-online")}
    rep = evaluate([small_run], EvaluateOptions(features=["q_max"], fits=[str(p) for p in paths.values()]))
    drafts, _ = load_drafts_for_fit([small_run])
    for model, path in paths.items():
        fit = Fitter.load(path)
        rows = drafts.with_columns(pl.Series("_p", fit.predict(drafts, PredictContext(runs=[small_run]))))
        if model == "logistic":  # its held-out requests only
            trained = {int(r) for _, r in fit.training_["train_request_ids"]}
            rows = rows.filter(~pl.col("request").is_in(sorted(trained)))
            assert 0 < rows.height < drafts.height
        name = next(n for n in rep["features"] if n.startswith(model))
        block = rep["features"][name]
        lab = rows.filter(pl.col("label").is_not_null())
        y, p = lab["label"].to_numpy(), lab["_p"].to_numpy()
        assert block["n"] == lab.height
        assert block["auc"] == pytest.approx(roc_auc_score(y, p), abs=1e-9)
        assert block["log_loss"] == pytest.approx(log_loss(y, p, labels=[0, 1]), abs=1e-9)
        assert block["ece"] == pytest.approx(ece(y, p), abs=1e-12)
        steps = {}
        for r in rows.sort("request", "step", "position").iter_rows(named=True):
            acc, surv, pred = steps.get((r["request"], r["step"]), (0, 1.0, 0.0))
            surv *= r["_p"]
            steps[(r["request"], r["step"])] = (acc + (r["label"] == 1), surv, pred + surv)
        lc = rep["length_calibration"][name]
        assert lc["steps"] == len(steps)
        assert lc["mean_predicted"] == pytest.approx(np.mean([v[2] for v in steps.values()]), rel=1e-9)
        assert lc["mean_realised"] == pytest.approx(np.mean([v[0] for v in steps.values()]), abs=1e-12)
