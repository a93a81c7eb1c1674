"""Yield fitters: against references, learning a known signal, fit files, held-out scoring and the
report on a real greedy run with cache drafts."""

import json

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from svt.cli import app
from svt.errors import ConfigError, DataError
from svt.features.cache import YIELD_FEATURES
from svt.fit import FitData, Fitter, fit_runs, get_fitter, split_mask

from ..conftest import ROOT

COSTS = ROOT / "configs" / "costs" / "h100-llama8b-eagle.yaml"


def _synthetic(n, seed):
    rng = np.random.default_rng(seed)
    cols = {f: rng.random(n) for f in YIELD_FEATURES if f != "log_match_len"}  # derived from match_len
    cols["draft_len"] = rng.integers(1, 17, n).astype(float)
    cols["match_len"] = rng.integers(0, 24, n).astype(float)
    cols["from_global"] = rng.random(n) < 0.3
    # a nonlinear yield: long matches in non-punctuation drafts, capped by the draft length
    signal = np.where(cols["draft_punct"] < 0.5, cols["match_len"] / 2, 1.0) + 2 * cols["hist_yield_mean"]
    y = np.minimum(cols["draft_len"], np.round(signal + rng.normal(0, 0.5, n)).clip(0))
    frame = pl.DataFrame({**cols, "oracle_accepted": y.astype(np.int64), "_run": np.zeros(n, dtype=np.int64),
                          "request": np.arange(n) // 20})
    return frame


@pytest.mark.parametrize("model", ["yield-mlp", "yield-gbm", "yield-linear"])
def test_yield_fitters_learn_a_known_signal(model):
    train, test = _synthetic(6000, 0), _synthetic(2000, 1)
    est = get_fitter(model).from_options(seed=0).fit(FitData(train, 16))
    pred = est.predict(test)
    y = test["oracle_accepted"].to_numpy()
    mse = np.mean((pred - y) ** 2)
    assert (pred >= 0).all() and (pred <= test["draft_len"].to_numpy()).all()
    # the linear model cannot represent the interaction; the MLP and the GBM must
    assert mse < (0.6 if model == "yield-linear" else 0.2) * np.var(y), mse


def test_yield_linear_is_least_squares():
    train = _synthetic(3000, 2)
    est = get_fitter("yield-linear").from_options().fit(FitData(train, 16))
    from svt.fit.yield_models import yield_matrix

    X = yield_matrix(train, list(YIELD_FEATURES))
    np.testing.assert_allclose(X[:, YIELD_FEATURES.index("log_match_len")], np.log1p(train["match_len"].to_numpy()))
    A = np.column_stack([X, np.ones(len(X))])
    beta = np.linalg.lstsq(A, train["oracle_accepted"].to_numpy().astype(float), rcond=None)[0]
    raw = est._raw(X)
    np.testing.assert_allclose(raw, A @ beta, atol=1e-4)


@pytest.mark.parametrize("model", ["yield-mlp", "yield-gbm", "yield-linear"])
def test_yield_fit_files_roundtrip(greedy_run, tmp_path, model):
    fit = fit_runs([greedy_run], model)
    path = fit.save(tmp_path / f"{model}.json")
    from svt.fit.yield_data import load_cache_drafts_for_fit

    rows, _ = load_cache_drafts_for_fit([greedy_run])
    np.testing.assert_allclose(Fitter.load(path).predict(rows), fit.predict(rows), rtol=1e-6, atol=1e-6)
    if model == "yield-gbm":
        side = tmp_path / json.loads(path.read_text())["weights"]
        side.write_bytes(side.read_bytes() + b"x")
        with pytest.raises(ConfigError, match="SHA-256"):
            Fitter.load(path)


def test_yield_scored_on_exactly_the_held_out_requests(greedy_run, tmp_path):
    from svt.fit.yield_data import load_cache_drafts_for_fit
    from svt.report import EvaluateOptions, evaluate

    fit = fit_runs([greedy_run], "yield-linear", test_fraction=0.5, seed=4)
    path = fit.save(tmp_path / "y.json")
    rows, _ = load_cache_drafts_for_fit([greedy_run])
    held = set(rows.filter(pl.Series(split_mask(rows, 0.5, 4)))["request"].unique().to_list())
    trained = set(rows["request"].unique().to_list()) - held
    assert fit.training_["train_requests"] == len(trained) and held and trained
    rep = evaluate([greedy_run], EvaluateOptions(features=["q_max"], fits=[str(path)],
                                                 costs=str(COSTS)))
    assert rep["yield"]["requests"] == len(held)
    n_held_drafts = rows.filter(pl.col("request").is_in(list(held))).height
    assert rep["yield"]["predictors"]["yield-linear"]["n"] == n_held_drafts
    assert rep["hvd"]["requests"] == len(held)
    policies = {r["policy"] for r in rep["hvd"]["rows"]}
    assert {"greedy", "model-only", "cache-only", "oracle-switch", "hvd yield-linear tau=6"} <= policies
    all_rows, _ = load_cache_drafts_for_fit([greedy_run], with_empty=True)
    assert rep["cache"]["all"]["positions"] == all_rows.height
    assert rep["cache"]["all"]["with_draft"] == rows.height


def test_yield_fit_needs_cache_drafts(small_run):
    res = CliRunner().invoke(app, ["fit", str(small_run), "--model", "yield-mlp", "--out", "/tmp/never.json"])
    assert res.exit_code == DataError.exit_code and "cache_drafts" in res.output and "Traceback" not in res.output


def test_live_av_refuses_a_yield_fit(greedy_run):
    from svt.fit import live_confidence

    with pytest.raises(ConfigError, match="acceptance predictor"):
        live_confidence(fit_runs([greedy_run], "yield-linear"))


def test_held_out_requests_do_not_move_when_rows_go_missing(greedy_run, tmp_path):
    """The fit stores its training requests: a run read later with fewer rows still scores only
    requests the fit never saw."""
    import shutil

    from svt.fit import evaluation_mask
    from svt.fit.yield_data import load_cache_drafts_for_fit

    fit = fit_runs([greedy_run], "yield-linear", test_fraction=0.5, seed=1)
    trained = {tuple(x) for x in fit.training_["train_request_ids"]}
    run = tmp_path / "r"
    shutil.copytree(greedy_run, run)
    rows, _ = load_cache_drafts_for_fit([run])
    ok = evaluation_mask(fit, rows, [fit.training_["runs"][0]["run_id"]])
    scored = {tuple(x) for x in rows.filter(pl.Series(ok)).select("_run", "request").unique().rows()}
    assert scored and not scored & trained
    assert scored | trained == {tuple(x) for x in rows.select("_run", "request").unique().rows()}


def test_hvd_replay_keeps_requests_without_drafts(greedy_run, tmp_path):
    """Every output token is walked, whether or not the cache drafted at its request."""
    import shutil

    from svt.cli import app as cli

    run = tmp_path / "r"
    shutil.copytree(greedy_run, run)
    res = CliRunner().invoke(cli, ["cache", str(run), "--set", "min_token_prob=0.95", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    from svt.report import EvaluateOptions, evaluate
    from svt.traces.io import open_run

    rep = evaluate([run], EvaluateOptions(features=["q_max"], costs=str(COSTS)))
    tokens = open_run(run).scan("requests").select(pl.col("output_ids").list.len().sum()).collect().item()
    greedy = next(r for r in rep["hvd"]["rows"] if r["group"] == "all" and r["policy"] == "greedy")
    assert greedy["tokens"] == tokens and rep["hvd"]["requests"] == 12


def test_damaged_mlp_weights_and_bad_fit_paths(greedy_run, tmp_path):
    fit = fit_runs([greedy_run], "yield-mlp")
    with pytest.raises(ConfigError, match=".json"):
        fit.save(tmp_path / "m.safetensors")
    path = fit.save(tmp_path / "m.json")
    w = tmp_path / "m.safetensors"
    w.write_bytes(w.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ConfigError, match="SHA-256"):
        Fitter.load(path)
    with pytest.raises(ConfigError, match="--feature"):
        fit_runs([greedy_run], "yield-linear", feature="q_max")


def test_report_replay_of_a_rule_equals_an_independent_walk(greedy_run):
    """The report's `hvd match_len tau=2` equals walking every request with `match_len > 2` (an
    integer rule: many predictions equal τ exactly, which must not verify the cache)."""
    from svt.fit.yield_data import load_cache_drafts_for_fit
    from svt.report import EvaluateOptions, evaluate
    from svt.simulate.cost_files import load_costs
    from svt.simulate.hvd import HVDRequest, walk

    rep = evaluate([greedy_run], EvaluateOptions(features=["q_max"], costs=str(COSTS)))
    rows, _ = load_cache_drafts_for_fit([greedy_run], with_empty=True)
    assert (rows["match_len"] == 2).sum() > 0
    costs = load_costs(COSTS)
    cycles = 0
    for _, part in rows.group_by("request", maintain_order=True):
        req = HVDRequest("w", part["draft_len"].to_numpy(), part["oracle_accepted"].to_numpy(),
                         part["model_accepted"].to_numpy(), part["lookup_ms"].to_numpy().astype(float))
        cycles += walk(req, part["match_len"].to_numpy() > 2, 4, costs, consult=True).cycles
    got = next(r for r in rep["hvd"]["rows"] if r["group"] == "all" and r["policy"] == "hvd match_len tau=2")
    assert got["cycles"] == cycles
