"""Fit files are checked on load against the fields their fitter writes (`Fitter.check_fields`): a
hand-edited or damaged value is one ConfigError naming the file and the field, never a traceback
later nor a wrong number (a NaN intercept dropped its position's rows from the scores, a NaN slope
scored nothing with exit 0, a yield-linear std 0 gave garbage, a list slope was a traceback)."""

import functools
import json
import re

import numpy as np
import polars as pl
import pytest
from scipy.special import expit
from typer.testing import CliRunner

from svt.cli import app
from svt.errors import ConfigError
from svt.features.cache import YIELD_FEATURES
from svt.fit import FITTERS, FitData, Fitter, fit_runs, get_fitter, register_fitter

K = 4
TRAINING = {"runs": [{"run_id": "synthetic"}], "rows": 0, "k": K}  # a whole `training` block


def _drafts(n=3000, seed=0):
    """Labelled drafts in replay order (8 per decode step) from a known logistic model."""
    rng = np.random.default_rng(seed)
    q = rng.uniform(0.02, 0.98, n)
    pos = np.tile(np.arange(K), n // K + 1)[:n]
    y = (rng.random(n) < expit(1.2 * np.log(q / (1 - q)) + np.linspace(0.4, -0.4, K)[pos])).astype(np.int8)
    return pl.DataFrame({"q_max": q, "q_entropy": rng.uniform(0, 3, n), "position": pos.astype(np.int16),
                         "label": y, "decode_step": np.arange(n) // 8})


def _cache_rows(n=120, seed=0):
    """Cache-draft rows whose yield is linear in the match length."""
    rng = np.random.default_rng(seed)
    cols = {f: rng.random(n) for f in YIELD_FEATURES if f != "log_match_len"}  # derived from match_len
    cols |= {"draft_len": rng.integers(1, 17, n).astype(float), "match_len": rng.integers(0, 24, n).astype(float),
             "from_global": rng.random(n) < 0.3}
    y = np.minimum(cols["draft_len"], np.round(cols["match_len"] / 3 + rng.normal(0, 0.5, n)).clip(0))
    return pl.DataFrame({**cols, "oracle_accepted": y.astype(np.int64), "_run": np.zeros(n, dtype=np.int64),
                         "request": np.arange(n) // 20})


def _head():
    import torch

    from svt.fit.head import ConfidenceHead, HeadConfig, HeadFitter

    fit = HeadFitter()
    fit.config_ = HeadConfig(hidden_size=8, k=K)
    fit.head_ = ConfidenceHead(fit.config_)
    fit.head_.register_buffer("input_mean", torch.zeros(8))
    fit.head_.register_buffer("input_std", torch.ones(8))
    fit.log_ = {"epochs": 1, "best_val_log_loss": 0.6}
    return fit


@functools.cache
def _fitted(model: str, options: str) -> Fitter:
    """One fit per model and options (JSON) for the whole module: each test saves its own file."""
    if model == "head":  # untrained weights: the file's fields are what is checked
        return _head()
    import torch

    data = FitData(_cache_rows(), 16) if model.startswith("yield") else FitData(_drafts(), K)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a net of 8 units on 120 rows: more threads only wait on a busy machine
    try:
        return get_fitter(model).from_options(**json.loads(options)).fit(data)
    finally:
        torch.set_num_threads(threads)


def _saved(tmp_path, model: str, **options):
    fit = _fitted(model, json.dumps(options, sort_keys=True))
    fit.training_ = json.loads(json.dumps(TRAINING))
    return fit, fit.save(tmp_path / f"{model}.json")


def _edited(path, edit):
    """The fit file after ``edit(d)``, written as a hand edit would (NaN as the NaN token)."""
    d = json.loads(path.read_text())
    edit(d)
    path.write_text(json.dumps(d))
    return path


def _refused(path, field: str) -> str:
    with pytest.raises(ConfigError) as exc:
        Fitter.load(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: a damaged ") and f"`{field}" in msg, msg
    assert exc.value.__cause__ is None and exc.value.__suppress_context__  # one message, no chained traceback
    return msg


CASES = [("logistic", {}), ("logistic", {"per_position_slope": True}),
         ("logistic", {"features": ["logit_qmax", "entropy"]}),
         ("logistic", {"features": ["logit_qmax", "entropy"], "per_position_slope": True}),
         ("irls-online", {}), ("irls-online", {"per_position_slope": True}), ("sts", {}), ("platt", {}),
         ("isotonic", {}), ("head", {}), ("yield-linear", {}), ("yield-gbm", {}), ("yield-mlp", {"mlp_hidden": 8})]


@pytest.mark.parametrize(("model", "options"), CASES, ids=[f"{m}{'-' if o else ''}{'-'.join(o)}" for m, o in CASES])
def test_a_valid_fit_file_loads_unchanged(tmp_path, model, options):
    fit, path = _saved(tmp_path, model, **options)
    loaded = Fitter.load(path)
    assert type(loaded) is type(fit) and loaded.record() == fit.record()
    beside = ("weights", "weights_sha256")  # the file also names the weights it keeps beside it
    assert {k: v for k, v in json.loads(path.read_text()).items() if k not in beside} == fit.record()
    if model == "head":
        return
    frame = _cache_rows(60, seed=1) if model.startswith("yield") else _drafts(400, seed=1)
    np.testing.assert_allclose(loaded.predict(frame), fit.predict(frame), rtol=1e-6, atol=1e-9)


def test_every_fitter_checks_its_own_fields():
    assert all(cls.check_fields.__func__ is not Fitter.check_fields.__func__ for cls in FITTERS.values())

    class Unchecked(Fitter):
        name = "unchecked"

    with pytest.raises(ValueError, match="check_fields"):
        register_fitter(Unchecked)
    assert "unchecked" not in FITTERS


@pytest.mark.parametrize("model", ["logistic", "irls-online", "platt"])
def test_a_nan_intercept_at_one_position_is_refused(tmp_path, model):
    _, path = _saved(tmp_path, model)
    if model == "platt":  # one intercept, written once per position
        _edited(path, lambda d: d.update(intercepts=[float("nan")] * K))
    else:
        _edited(path, lambda d: d["intercepts"].__setitem__(2, float("nan")))
    msg = _refused(path, "intercepts[0]" if model == "platt" else "intercepts[2]")
    assert "is nan, not a finite number" in msg


@pytest.mark.parametrize("model", ["logistic", "irls-online", "platt"])
def test_a_null_slope_is_refused(tmp_path, model):
    _, path = _saved(tmp_path, model)
    assert "is null, not a finite number" in _refused(_edited(path, lambda d: d.update(slope=None)), "slope")


@pytest.mark.parametrize(("model", "options", "at"), [
    ("logistic", {}, ""), ("logistic", {"per_position_slope": True}, "[1]"),
    ("logistic", {"features": ["logit_qmax", "entropy"]}, "[1]"),
    ("logistic", {"features": ["logit_qmax", "entropy"], "per_position_slope": True}, "[1][3]"),
    ("irls-online", {}, ""), ("irls-online", {"per_position_slope": True}, "[1]")])
def test_a_nan_slope_is_refused(tmp_path, model, options, at):
    _, path = _saved(tmp_path, model, **options)

    def nan_at(d):
        if not at:
            d["slope"] = float("nan")
        else:
            idx = [int(i) for i in re.findall(r"\d+", at)]
            inner = d["slope"] if len(idx) == 1 else d["slope"][idx[0]]
            inner[idx[-1]] = float("nan")

    assert "is nan" in _refused(_edited(path, nan_at), f"slope{at}`")


@pytest.mark.parametrize("model", ["logistic", "irls-online"])
def test_a_list_slope_on_a_shared_slope_model_is_refused(tmp_path, model):
    _, path = _saved(tmp_path, model)
    msg = _refused(_edited(path, lambda d: d.update(slope=[d["slope"]] * K)), "slope")
    assert "a list of 4, not a finite number" in msg and "`options.per_position_slope` is false" in msg


@pytest.mark.parametrize("model", ["logistic", "irls-online"])
def test_a_per_position_slope_flag_inconsistent_with_the_slope_is_refused(tmp_path, model):
    _, shared = _saved(tmp_path, model)
    msg = _refused(_edited(shared, lambda d: d["options"].update(per_position_slope=True)), "slope")
    assert "`options.per_position_slope` is true" in msg and f"expected a list of {K} numbers" in msg
    _, per = _saved(tmp_path, model, per_position_slope=True)
    msg = _refused(_edited(per, lambda d: d["options"].update(per_position_slope=False)), "slope")
    assert "expected one number" in msg
    _, per = _saved(tmp_path, model, per_position_slope=True)  # a string would read as true
    _refused(_edited(per, lambda d: d["options"].update(per_position_slope="false")), "options.per_position_slope")


@pytest.mark.parametrize("model", ["logistic", "irls-online"])
def test_a_per_position_slope_of_the_wrong_length_is_refused(tmp_path, model):
    _, path = _saved(tmp_path, model, per_position_slope=True)
    assert "has 3 values, expected 4" in _refused(_edited(path, lambda d: d["slope"].pop()), "slope")


def test_yield_linear_std_0_is_refused(tmp_path):
    _, path = _saved(tmp_path, "yield-linear")
    msg = _refused(_edited(path, lambda d: d["std"].__setitem__(3, 0.0)), "std[3]")
    assert "is 0, not above 0" in msg and "divided" in msg


def test_yield_mlp_std_0_is_refused(tmp_path):
    _, path = _saved(tmp_path, "yield-mlp", mlp_hidden=8)
    _refused(_edited(path, lambda d: d["std"].__setitem__(0, -1.0)), "std[0]")


@pytest.mark.parametrize("field", ["coef", "mean", "intercept"])
def test_yield_linear_nan_coefficient_is_refused(tmp_path, field):
    _, path = _saved(tmp_path, "yield-linear")

    def nan(d):
        if field == "intercept":
            d["intercept"] = float("nan")
        else:
            d[field][1] = float("nan")

    _refused(_edited(path, nan), field if field == "intercept" else f"{field}[1]")


def test_yield_linear_coefficients_of_another_length_are_refused(tmp_path):
    _, path = _saved(tmp_path, "yield-linear")
    n = len(YIELD_FEATURES)
    assert f"expected {n}" in _refused(_edited(path, lambda d: d["coef"].append(0.0)), "coef")


@pytest.mark.parametrize(("model", "field"), [
    ("logistic", "intercepts"), ("logistic", "slope"), ("irls-online", "path"), ("irls-online", "options"),
    ("sts", "temperatures"), ("platt", "feature"), ("isotonic", "y_thresholds"), ("head", "config"),
    ("yield-linear", "std"), ("yield-linear", "coef"), ("yield-mlp", "mean"), ("yield-gbm", "weights_sha256")])
def test_a_missing_field_is_refused(tmp_path, model, field):
    _, path = _saved(tmp_path, model, **({"mlp_hidden": 8} if model == "yield-mlp" else {}))
    assert f"`{field}` is missing" in _refused(_edited(path, lambda d: d.pop(field)), field)


def test_an_online_fits_coefficient_path_is_checked(tmp_path):
    _, path = _saved(tmp_path, "irls-online")
    assert len(json.loads(path.read_text())["path"]) > 2
    _refused(_edited(path, lambda d: d["path"][1]["intercepts"].__setitem__(0, float("nan"))), "path[1].intercepts[0]")
    _, path = _saved(tmp_path, "irls-online")
    _refused(_edited(path, lambda d: d["path"].reverse()), "path[1].cycle")
    _, path = _saved(tmp_path, "irls-online")  # a refit twice in one cycle
    _refused(_edited(path, lambda d: d["path"][1].update(cycle=d["path"][0]["cycle"])), "path[1].cycle")
    _, path = _saved(tmp_path, "irls-online")
    _refused(_edited(path, lambda d: d["path"][0].update(slope=[1.0, 1.0])), "path[0].slope")
    _, path = _saved(tmp_path, "irls-online")
    assert "`path[2].rows` is missing" in _refused(_edited(path, lambda d: d["path"][2].pop("rows")), "path[2].rows")
    _, path = _saved(tmp_path, "irls-online")
    _refused(_edited(path, lambda d: d["options"].update(damping=-1.0)), "options")
    _, path = _saved(tmp_path, "irls-online")
    _refused(_edited(path, lambda d: d["options"].update(cycle_steps="10")), "options.cycle_steps")
    _, path = _saved(tmp_path, "irls-online")
    _refused(_edited(path, lambda d: d["options"].update(magic=1)), "options")
    _, path = _saved(tmp_path, "irls-online")
    _refused(_edited(path, lambda d: d.update(feature="q_max")), "feature")


def test_a_calibrators_fields_are_checked(tmp_path):
    _, path = _saved(tmp_path, "sts")
    _refused(_edited(path, lambda d: d["temperatures"].__setitem__(1, 0.0)), "temperatures[1]")
    _, path = _saved(tmp_path, "sts")  # derived from the temperatures: an edit would be ignored
    _refused(_edited(path, lambda d: d["slope"].__setitem__(1, 5.0)), "slope")
    _, path = _saved(tmp_path, "platt")  # one intercept: an edit at one position would be ignored
    _refused(_edited(path, lambda d: d["intercepts"].__setitem__(2, 0.5)), "intercepts")
    _, path = _saved(tmp_path, "isotonic")
    _refused(_edited(path, lambda d: d["x_thresholds"].reverse()), "x_thresholds[1]")
    _, path = _saved(tmp_path, "isotonic")
    _refused(_edited(path, lambda d: d["y_thresholds"].__setitem__(-1, 1.5)), "y_thresholds[")


def test_a_heads_and_a_yield_mlps_config_is_checked(tmp_path):
    _, path = _saved(tmp_path, "head")
    _refused(_edited(path, lambda d: d["config"].update(hidden_size=0)), "config.hidden_size")
    _, path = _saved(tmp_path, "head")
    assert "`config.k` is missing" in _refused(_edited(path, lambda d: d["config"].pop("k")), "config.k")
    _, path = _saved(tmp_path, "yield-mlp", mlp_hidden=8)
    _refused(_edited(path, lambda d: d["config"].update(n_features=3)), "config.n_features")


def test_svt_evaluate_with_a_damaged_fit_is_one_message(small_run, tmp_path):
    fit = fit_runs([small_run], "logistic")
    path = _edited(fit.save(tmp_path / "l.json"), lambda d: d.update(slope=float("nan")))
    r = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "rep"), "--feature", "q_max",
                                 "--fit", str(path)])
    assert r.exit_code == ConfigError.exit_code, r.output
    assert "`slope` is nan" in r.output and str(path) in r.output and "Traceback" not in r.output
    assert not (tmp_path / "rep" / "report.json").exists()
