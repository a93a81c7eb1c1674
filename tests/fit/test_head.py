"""The confidence head: learns a real signal, saves as safetensors + JSON, scores held-out requests."""

import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from svt.errors import DataError
from svt.fit import Fitter, fit_runs
from svt.fit.head import HeadConfig, predict_head, train_head


@pytest.mark.parametrize("mlp_hidden", [0, 16])
def test_head_learns_a_direction_in_the_hidden_state(mlp_hidden):
    rng = np.random.default_rng(0)
    n, H = 6000, 24
    h = rng.normal(size=(n, H)).astype(np.float32)
    pos = rng.integers(0, 4, n)
    z = 2.0 * h[:, 3] - 1.5 * h[:, 7] + np.array([0.5, 0.0, -0.5, -1.0])[pos]
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(np.float32)
    group = np.arange(n) // 10
    model, log = train_head(h[:5000], pos[:5000], y[:5000], group[:5000],
                            HeadConfig(hidden_size=H, k=4, mlp_hidden=mlp_hidden), device="cpu")
    p = predict_head(model, h[5000:], pos[5000:])
    oracle = roc_auc_score(y[5000:], z[5000:])
    assert roc_auc_score(y[5000:], p) > oracle - 0.02
    assert log["epochs"] >= 2 and log["best_val_log_loss"] < 0.6


def test_head_fit_file_roundtrip_and_evaluation(small_run, tmp_path):
    fit = fit_runs([small_run], "head", device="cpu")
    path = fit.save(tmp_path / "head.json")
    assert (tmp_path / "head.safetensors").is_file()
    saved = json.loads(path.read_text())
    assert saved["weights"] == "head.safetensors" and saved["config"]["hidden_size"] > 0
    from svt.report import EvaluateOptions, evaluate

    rep = evaluate([small_run], EvaluateOptions(features=["q_max"], fits=[str(path)]))
    block = rep["features"]["head(hidden)"]
    assert block["lossless"] is True and 0 < block["n"] < rep["features"]["q_max"]["n"]
    (tmp_path / "head.safetensors").unlink()
    with pytest.raises(Exception, match="weights file"):
        Fitter.load(path)


def test_head_needs_hidden_states(tmp_path, small_run):
    import shutil

    run = tmp_path / "nohidden"
    shutil.copytree(small_run, run)
    shutil.rmtree(run / "hidden")
    with pytest.raises(DataError, match="log.hidden=true"):
        fit_runs([run], "head", device="cpu")


def test_hidden_matrix_rows_follow_the_drafts_frame(small_run):
    """Each row is the logged state of that draft (float16 read exactly into float32), in the
    frame's order, whatever order the frame comes in."""
    import polars as pl

    from svt.fit.head import hidden_matrix
    from svt.traces import open_run

    run = open_run(small_run)
    drafts = (run.scan("drafts").select("request", "step", "position").collect()
              .with_columns(pl.lit(0).alias("_run")).sample(fraction=1.0, shuffle=True, seed=3).head(500))
    h = hidden_matrix(drafts, [small_run])
    table = run.scan("hidden").collect()
    for i, (req, step, pos) in enumerate(drafts.select("request", "step", "position").head(50).rows()):
        want = table.filter((pl.col("request") == req) & (pl.col("step") == step) & (pl.col("position") == pos))
        assert h.dtype == np.float32 and np.array_equal(h[i], np.asarray(want["hidden"][0].to_list(), np.float32))
