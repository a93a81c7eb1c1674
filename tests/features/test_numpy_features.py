"""Built-in features with a numpy form (live AV scores a step's drafts with it inside the engine):
the numpy form gives the polars expression's values, edge probabilities included, and an online
fit's live confidences equal its predictions through the polars path."""

import numpy as np
import polars as pl
import pytest

from svt.features import FEATURES, feature_values, get_feature


def _q_columns(rng, n=400):
    q = rng.uniform(0, 1, n).astype(np.float32)
    q[:6] = [0.0, 1.0, 1e-9, 1 - 1e-9, 0.5, 1e-6]  # the clip's edges
    return {"q_max": q, "q_sampled": q, "q_entropy": rng.uniform(0, 3, n).astype(np.float32),
            "q_margin": (q * rng.uniform(0, 1, n)).astype(np.float32),
            "confidence": rng.permutation(q)}  # a confidence head's column, edges included


@pytest.mark.parametrize("name", sorted(n for n, f in FEATURES.items() if f.numpy is not None))
def test_the_numpy_form_gives_the_expressions_values(name):
    cols = _q_columns(np.random.default_rng(0))
    f = get_feature(name)
    want = feature_values(f, pl.DataFrame(cols))
    np.testing.assert_allclose(f.numpy(cols), want, rtol=1e-15, atol=0)


def test_an_online_fits_live_confidences_are_its_predictions(small_run, tmp_path):
    from svt.fit import Fitter, fit_runs, live_confidence

    path = fit_runs([small_run], "irls-online").save(tmp_path / "online.json")
    fit = Fitter.load(path)
    assert get_feature(fit.est_.options.feature).numpy is not None  # the fast path is the one tested
    cols = _q_columns(np.random.default_rng(1), 48)
    feats = {k: v.reshape(12, 4) for k, v in cols.items() if k != "q_sampled"}  # the run's K = 4
    pos = np.tile(np.arange(4), (12, 1))
    got = live_confidence(fit)(feats, pos)
    frame = pl.DataFrame({**{k: v.ravel() for k, v in feats.items()}, "position": pos.ravel()})
    want = fit.est_.predict_proba(feature_values(get_feature(fit.est_.options.feature), frame), pos.ravel())
    np.testing.assert_allclose(got.ravel(), want, rtol=1e-15, atol=0)
