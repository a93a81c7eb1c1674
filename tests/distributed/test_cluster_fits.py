"""``svt evaluate RUN --fit FIT --cluster local:2`` scores a fit on the rows one machine scores it
on: its held-out requests on its own training run, every request shown not to repeat a training
request on a run it never saw; the same counts, AUC, log-loss and description as the single
machine's report. Fits whose prediction needs more than a drafts row are refused by name."""

import json

import pytest
from typer.testing import CliRunner

from svt.cli import app
from svt.report import EvaluateOptions, evaluate


def _fit(run, out, model, *extra):
    r = CliRunner().invoke(app, ["fit", str(run), "--model", model, "--out", str(out), *extra])
    assert r.exit_code == 0, r.output
    return out


def _cluster(run, out, fits, *extra):
    args = ["evaluate", str(run), "--out", str(out), "--cluster", "local:2", "--feature", "q_max", *extra]
    for f in fits:
        args += ["--fit", str(f)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    return json.loads((out / "report.json").read_text())


def _same(got: dict, ref: dict) -> None:
    scopes = [(got, ref), (got["excluding_first"], ref["excluding_first"]),
              *[(got["per_position"][str(j)], ref["per_position"][j]) for j in ref["per_position"]]]
    for a, b in scopes:
        assert a["n"] == b["n"] and a["accept_rate"] == pytest.approx(b["accept_rate"], abs=1e-15)
        assert a["auc"] == pytest.approx(b["auc"], abs=1e-12) and a["auc_bound"] == 0.0
        for m in ("log_loss", "brier", "mean_pred", "ece", "ece_mass"):
            assert a[m] == pytest.approx(b[m], rel=1e-12, abs=1e-15), m


@pytest.fixture(scope="module")
def fits(small_run, tmp_path_factory):
    d = tmp_path_factory.mktemp("fits")
    return [_fit(small_run, d / "logistic.json", "logistic", "--features", "logit_qmax", "--features", "entropy"),
            _fit(small_run, d / "isotonic.json", "isotonic")]


def test_fits_on_their_training_run_score_its_held_out_requests(small_run, fits, tmp_path):
    got = _cluster(small_run, tmp_path / "c", fits)
    ref = evaluate([small_run], EvaluateOptions(features=["q_max"], fits=[str(f) for f in fits]))["features"]
    names = [n for n in ref if n != "q_max"]
    assert len(names) == 2 and set(names) <= set(got["features"])
    for n in names:
        _same(got["features"][n], ref[n])
        assert got["features"][n]["description"] == ref[n]["description"]
        assert "held-out requests" in got["features"][n]["description"]
    assert got["features"]["logistic(logit_qmax, entropy)"]["n"] < got["features"]["q_max"]["n"]  # held out only


def test_a_fit_on_a_run_it_never_saw_scores_every_request_shown_new(small_run, greedy_run, tmp_path):
    fit = _fit(greedy_run, tmp_path / "g.json", "platt")
    got = _cluster(small_run, tmp_path / "c", [fit])
    ref = evaluate([small_run], EvaluateOptions(features=["q_max"], fits=[str(fit)]))["features"]
    name = next(n for n in ref if n != "q_max")
    _same(got["features"][name], ref[name])
    assert got["features"][name]["n"] == got["features"]["q_max"]["n"]


@pytest.mark.parametrize("model, trained_on, words", [("irls-online", "small_run", "prequentially"),
                                                      ("yield-linear", "greedy_run", "scores the cache_drafts table")])
def test_fits_that_need_more_than_a_row_are_refused_by_name(small_run, tmp_path, request, model, trained_on, words):
    fit = _fit(request.getfixturevalue(trained_on), tmp_path / "f.json", model)
    r = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "r"), "--cluster", "local:1",
                                 "--fit", str(fit)])
    assert r.exit_code != 0 and words in r.output and "Traceback" not in r.output
    assert not (tmp_path / "r" / "report.json").exists()


def test_a_fitter_says_whether_it_scores_row_by_row():
    """A head reads hidden states, the online estimator replays in order: neither is row-wise."""
    from svt.fit import get_fitter

    assert {m: get_fitter(m).row_wise for m in ("logistic", "sts", "platt", "isotonic", "head", "irls-online")} == {
        "logistic": True, "sts": True, "platt": True, "isotonic": True, "head": False, "irls-online": False}


def test_requests_signed_on_the_workers_are_judged_as_from_the_drafts(small_run, fits):
    """The held-out decision from one row a request (signatures computed where the shards lie)
    equals the one from the drafts, on a run the fit is told nothing of (no id, no tokens: the
    acceptance sequences alone decide which requests repeat training requests: here most do, so
    the run is refused as the fit's training data, in the same words)."""
    import polars as pl

    from svt.distributed.fits import shard_request_rows
    from svt.errors import DataError
    from svt.fit import Fitter, evaluation_mask, load_drafts_for_fit

    fit = Fitter.load(fits[0])
    fit.training_ = {**fit.training_, "train_token_signatures": None}
    drafts, _ = load_drafts_for_fit([small_run])
    per_request = pl.concat([shard_request_rows((str(p), 0)) for p in sorted((small_run / "drafts").glob("*.parquet"))])
    assert per_request["_signature"].null_count() < per_request.height  # some requests are signed
    outcomes = []
    for frame in (drafts, per_request):
        with pytest.raises(DataError) as exc:
            evaluation_mask(fit, frame, [None])
        outcomes.append(str(exc.value))
    assert outcomes[0] == outcomes[1] and "repeat the logistic fit's training requests" in outcomes[0]


def test_a_fit_with_nothing_to_score_keeps_its_block_and_why(small_run, tmp_path):
    """Fitted with no request held out, a fit has nothing to score on its own run: its block stays,
    with n = 0, the reason and the description, as on one machine (a probe found it dropped)."""
    fit = _fit(small_run, tmp_path / "all.json", "logistic", "--test-fraction", "0")
    got = _cluster(small_run, tmp_path / "c", [fit])["features"]
    ref = evaluate([small_run], EvaluateOptions(features=["q_max"], fits=[str(fit)]))["features"]
    name = next(n for n in ref if n != "q_max")
    assert got[name]["n"] == ref[name]["n"] == 0
    assert got[name]["reasons"] == ref[name]["reasons"] and got[name]["description"] == ref[name]["description"]


def test_two_runs_keep_their_own_scored_requests(small_run, greedy_run, tmp_path):
    """The scored requests are kept per run: a fit of two runs scores each one's own held-out
    requests, as on one machine (pooled request ids would score one run's training requests that
    share an id with the other's held-out ones)."""
    fit = tmp_path / "two.json"
    r = CliRunner().invoke(app, ["fit", str(small_run), str(greedy_run), "--model", "logistic", "--features",
                                 "logit_qmax", "--out", str(fit)])
    assert r.exit_code == 0, r.output
    args = ["evaluate", str(small_run), str(greedy_run), "--out", str(tmp_path / "c"), "--cluster", "local:2",
            "--feature", "q_max", "--fit", str(fit)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    got = json.loads((tmp_path / "c" / "report.json").read_text())["features"]
    ref = evaluate([small_run, greedy_run], EvaluateOptions(features=["q_max"], fits=[str(fit)]))["features"]
    name = next(n for n in ref if n != "q_max")
    _same(got[name], ref[name])
    assert got[name]["n"] < got["q_max"]["n"]
