"""`svt fit --model a,b,c`: several fits in one process, each the same as fitted alone; every
output path and option checked before the first fit runs."""

import json

import pytest
from typer.testing import CliRunner

from svt.cli import app

MODELS = ["irls-online", "logistic", "isotonic"]


def _coefficients(path):
    data = json.loads(path.read_text())
    data.pop("created", None)
    data["training"].pop("runs", None)  # holds the run's path, the same in both
    return data


def test_several_models_in_one_call_equal_each_fitted_alone(small_run, tmp_path):
    r = CliRunner().invoke(app, ["fit", str(small_run), "--model", ",".join(MODELS), "--out", str(tmp_path / "all")])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "all").iterdir()) == sorted(f"{m}.json" for m in MODELS)
    for m in MODELS:
        assert f"wrote {tmp_path / 'all' / (m + '.json')}" in r.output.replace("\n", "")
        alone = tmp_path / f"{m}-alone.json"
        assert CliRunner().invoke(app, ["fit", str(small_run), "--model", m, "--out", str(alone)]).exit_code == 0
        assert _coefficients(tmp_path / "all" / f"{m}.json") == _coefficients(alone), m


@pytest.mark.parametrize("args, message", [
    (["--model", "irls-online,logistic,irls-online"], "more than once"),
    (["--model", "irls-online,,logistic"], "separated by commas"),
    (["--model", "irls-online,magic"], "known fitters"),
    (["--model", "irls-online,logistic", "--preset", "vllm"], "--preset"),
    (["--model", "logistic,isotonic", "--by", "workload"], "--by fits one model"),
])
def test_a_bad_request_writes_nothing(small_run, tmp_path, args, message):
    """The second model's problem is found before the first model is fitted: no file appears."""
    out = tmp_path / "fits"
    r = CliRunner().invoke(app, ["fit", str(small_run), *args, "--out", str(out)])
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output
    assert not out.exists() or not any(out.iterdir())


def test_several_models_need_a_directory_and_overwrite_is_per_file(small_run, tmp_path):
    a_file = tmp_path / "f.json"
    a_file.write_text("{}")
    r = CliRunner().invoke(app, ["fit", str(small_run), "--model", "irls-online,logistic", "--out", str(a_file)])
    assert r.exit_code == 2 and "takes a directory" in " ".join(r.output.split()), r.output
    out = tmp_path / "fits"
    args = ["fit", str(small_run), "--model", "irls-online,logistic", "--out", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "--overwrite" in r.output, r.output
    assert CliRunner().invoke(app, [*args, "--overwrite"]).exit_code == 0
