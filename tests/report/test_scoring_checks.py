"""Issue 34: a fit whose predictions are not probabilities on rows it is scored on (NaN where a
fitter's predict failed, or a value outside [0, 1]) was silently "not scored" there: the report
showed a smaller n and exit 0. It is one error naming the fit and the first row."""

import numpy as np
import pytest

from svt.errors import DataError
from svt.fit import fit_runs
from svt.fit.logistic import LogisticFitter
from svt.report import EvaluateOptions, evaluate


@pytest.fixture(scope="module")
def fit(small_run, tmp_path_factory):
    return fit_runs([small_run], "logistic").save(tmp_path_factory.mktemp("scoring") / "lr.json")


@pytest.mark.parametrize("bad", [np.nan, 1.5, -0.1])
def test_a_prediction_that_is_no_probability_is_an_error(small_run, fit, monkeypatch, bad):
    real = LogisticFitter.predict

    def broken(self, frame, ctx=None):
        p = np.array(real(self, frame, ctx), dtype=np.float64)
        p[frame["position"].to_numpy() == 2] = bad  # one position's rows
        return p

    monkeypatch.setattr(LogisticFitter, "predict", broken)
    with pytest.raises(DataError, match=r"predicts .* not a probability"):
        evaluate([small_run], EvaluateOptions(features=["q_max"], fits=[str(fit)]))


def test_a_sound_fit_is_scored_on_every_held_out_draft(small_run, fit):
    rep = evaluate([small_run], EvaluateOptions(features=["q_max"], fits=[str(fit)]))
    got = rep["features"]["logistic(logit_qmax)"]
    assert 0 < got["n"] < rep["features"]["q_max"]["n"]
