"""Bad input at the command line: one message, the documented exit code (2 usage/config, 3 schema,
4 model, 5 data), never a traceback."""

import json
import sys

import polars as pl
import pytest
from typer.testing import CliRunner

from svt.cli import app

runner = CliRunner()


def _ok(r, code, text):
    assert r.exit_code == code, r.output
    assert text in r.output and "Traceback" not in r.output, r.output


@pytest.fixture(scope="module")
def fit_file(small_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("fits") / "lg.json"
    assert runner.invoke(app, ["fit", str(small_run), "--model", "logistic", "--out", str(out)]).exit_code == 0
    return out


@pytest.mark.parametrize(("edit", "text"), [
    (lambda d: d.pop("intercepts"), "damaged logistic fit"),
    (lambda d: d.__setitem__("slope", "steep"), "damaged logistic fit"),
    (lambda d: d.__setitem__("feature", "nope"), "Unknown feature"),
    (lambda d: d.__setitem__("features", ["nope"]), "Unknown feature"),
])
def test_damaged_fit_files(small_run, fit_file, tmp_path, edit, text):
    d = json.loads(fit_file.read_text())
    edit(d)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(d))
    _ok(runner.invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "r"), "--fit", str(bad)]), 2, text)


@pytest.mark.parametrize(("args", "text"), [
    (["--model", "irls-online", "--cycle-steps", "0"], "cycle_steps"),
    (["--model", "irls-online", "--damping", "-1"], "damping"),
    (["--model", "irls-online", "--ridge", "-0.5"], "ridge"),
    (["--model", "logistic", "--preset", "vllm"], "--preset"),
    (["--model", "irls-online", "--preset", "nope"], "Unknown preset"),
    (["--model", "irls-online", "--label-delay", "100000"], "label_delay"),
    # an option the fitter does not take is refused, never dropped (issue 22)
    (["--model", "isotonic", "--mlp-hidden", "32"], "'isotonic' takes no --mlp-hidden"),
    (["--model", "logistic", "--device", "cpu"], "'logistic' takes no --device"),
    (["--model", "irls-online", "--features", "q_max"], "'irls-online' takes no --features"),
    (["--model", "logistic", "--feature", "q_max", "--features", "q_max"], "not both"),
    (["--model", "irls-online", "--test-fraction", "0.5"], "'irls-online' takes no --test-fraction"),
    (["--model", "irls-online", "--seed", "3"], "'irls-online' takes no --seed"),
    (["--model", "platt", "--damping", "1"], "'platt' takes no --damping (its options: --feature, --test-fraction"),
    (["--model", "irls-online", "--mlp-hidden", "8"], "--cycle-steps, --damping, --ridge, --label-delay"),
    (["--model", "irls-online", "--damping", "inf"], "damping"),
    (["--model", "irls-online", "--ridge", "inf"], "ridge"),
])
def test_bad_fit_options(small_run, tmp_path, args, text):
    _ok(runner.invoke(app, ["fit", str(small_run), *args, "--out", str(tmp_path / "f.json")]), 2, text)


def test_outputs_of_the_wrong_kind(small_run, fit_file, tmp_path):
    (tmp_path / "afile").write_text("x")
    _ok(runner.invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "afile"), "--feature", "q_max"]),
        2, "is a file")
    (tmp_path / "adir.json").mkdir()
    _ok(runner.invoke(app, ["fit", str(small_run), "--model", "logistic", "--out", str(tmp_path / "adir.json")]),
        2, "is a directory")
    _ok(runner.invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "r"), "--bins", "0"]), 2, "--bins")
    _ok(runner.invoke(app, ["plot", "reliability", str(fit_file), "--out", str(tmp_path / "x.png")]), 5,
        "not a fit file")
    _ok(runner.invoke(app, ["fit", str(small_run), str(small_run), "--model", "logistic", "--out",
                            str(tmp_path / "g.json")]), 5, "given twice")


def test_feature_modules_and_user_features(small_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a module in the current folder works without PYTHONPATH
    (tmp_path / "feats_ok.py").write_text(
        "import polars as pl\nfrom svt.features import feature\n\n"
        "@feature(lossless=True, description='q_max squared')\ndef qmax_sq_t():\n    return pl.col('q_max') ** 2\n")
    r = runner.invoke(app, ["evaluate", str(small_run), "--out", "rep", "--overwrite", "--feature-module", "feats_ok",
                            "--feature", "qmax_sq_t"])
    assert r.exit_code == 0, r.output
    # a user feature is fitted too (issue 22), and the fit is evaluated with the same module
    r = runner.invoke(app, ["fit", str(small_run), "--model", "logistic", "--feature", "qmax_sq_t",
                            "--feature-module", "feats_ok", "--out", "user.json"])
    assert r.exit_code == 0 and json.loads((tmp_path / "user.json").read_text())["feature"] == "qmax_sq_t", r.output
    r = runner.invoke(app, ["evaluate", str(small_run), "--out", "rep2", "--feature-module", "feats_ok",
                            "--feature", "q_max", "--fit", "user.json"])
    assert r.exit_code == 0, r.output
    (tmp_path / "feats_syntax.py").write_text("def broken(:\n")
    _ok(runner.invoke(app, ["evaluate", str(small_run), "--out", "rep", "--overwrite", "--feature-module", "feats_syntax"]), 2,
        "SyntaxError")
    (tmp_path / "feats_raise.py").write_text("raise RuntimeError('boom')\n")
    _ok(runner.invoke(app, ["evaluate", str(small_run), "--out", "rep", "--overwrite", "--feature-module", "feats_raise"]), 2, "boom")
    (tmp_path / "feats_raise2.py").write_text("raise RuntimeError('boom\\nsecond line')\n")
    _ok(runner.invoke(app, ["fit", str(small_run), "--model", "logistic", "--out", "f.json", "--feature-module",
                            "feats_raise2"]), 2, "boom second line")  # one line, whatever the module raised
    (tmp_path / "feats_clash.py").write_text(
        "import polars as pl\nfrom svt.features import feature\n\n"
        "@feature(lossless=True)\ndef q_max():\n    return pl.col('q_max')\n")
    _ok(runner.invoke(app, ["evaluate", str(small_run), "--out", "rep", "--overwrite", "--feature-module", "feats_clash"]), 2,
        "built-in feature")
    (tmp_path / "feats_cols.py").write_text(
        "import polars as pl\nfrom svt.features import feature\n\n"
        "@feature(lossless=True)\ndef no_col_t():\n    return pl.col('nope')\n\n"
        "@feature(lossless=True, probability=True)\ndef bad_prob_t():\n    return pl.col('q_max') * 3\n\n"
        "@feature(lossless=True)\ndef constant_t():\n    return pl.lit(1.0) + pl.col('q_max') * 0\n")
    _ok(runner.invoke(app, ["evaluate", str(small_run), "--out", "rep", "--overwrite", "--feature-module", "feats_cols",
                            "--feature", "no_col_t"]), 2, "cannot be computed")
    _ok(runner.invoke(app, ["evaluate", str(small_run), "--out", "rep", "--overwrite", "--feature-module", "feats_cols",
                            "--feature", "bad_prob_t"]), 5, "outside [0, 1]")
    r = runner.invoke(app, ["evaluate", str(small_run), "--out", "rep", "--overwrite", "--feature-module", "feats_cols",
                            "--feature", "constant_t"])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert rep["features"]["constant_t"]["auc"] == 0.5  # every pair tied: the ties-count-half AUC
    for m in [m for m in sys.modules if m.startswith("feats_")]:
        del sys.modules[m]


def test_head_on_a_run_of_another_hidden_size(small_run, tmp_path):
    import shutil

    from svt.errors import DataError
    from svt.fit import Fitter, PredictContext, fit_runs, load_drafts_for_fit

    from .conftest import reseal

    path = fit_runs([small_run], "head", device="cpu").save(tmp_path / "h.json")
    other = tmp_path / "other"
    shutil.copytree(small_run, other)
    shard = next((other / "hidden").glob("part-*.parquet"))
    h = pl.read_parquet(shard)
    h.with_columns(pl.col("hidden").list.head(16)).write_parquet(shard)
    meta = json.loads((other / "run.json").read_text())
    meta["run_id"] = "other"
    (other / "run.json").write_text(json.dumps(meta))
    reseal(other)
    fit = Fitter.load(path)
    drafts, _ = load_drafts_for_fit([other])
    with pytest.raises(DataError, match="hidden states of size"):
        fit.predict(drafts, PredictContext(runs=[other]))


def test_fit_out_never_replaces_a_file_that_is_not_a_fit(small_run, tmp_path):
    """`svt fit --out report.json` used to overwrite any .json (a baseline report included), with or
    without --overwrite; it is refused before any fitting, and the file is left as it was."""
    report = tmp_path / "report.json"
    report.write_text('{"report_schema": 1, "svt_version": "0.1.0"}\n')
    for extra in ([], ["--overwrite"]):
        _ok(runner.invoke(app, ["fit", str(small_run), "--model", "logistic", "--out", str(report), *extra]), 2,
            "not an svt fit file")
        assert report.read_text() == '{"report_schema": 1, "svt_version": "0.1.0"}\n'


def test_fit_out_replaces_an_existing_fit_only_with_overwrite(small_run, fit_file, tmp_path):
    out = tmp_path / "lg.json"
    out.write_bytes(fit_file.read_bytes())
    _ok(runner.invoke(app, ["fit", str(small_run), "--model", "isotonic", "--out", str(out)]), 2, "--overwrite")
    assert out.read_bytes() == fit_file.read_bytes()
    r = runner.invoke(app, ["fit", str(small_run), "--model", "isotonic", "--out", str(out), "--overwrite"])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["model"] == "isotonic"


@pytest.mark.parametrize("args, words", [
    (["--model", "yield-mlp", "--mlp-hidden", "-5"], "--mlp-hidden"),
    (["--model", "yield-mlp", "--mlp-hidden", "100000000"], "--mlp-hidden"),
    (["--model", "logistic", "--seed", "-5"], "--seed"),
    (["--model", "yield-linear", "--features", "draft_len", "--features", "draft_len"], "more than once"),
])
def test_fit_options_no_fitter_can_use_are_one_line(greedy_run, tmp_path, args, words):
    """Issue 23: these were tracebacks (an allocation of 4e16 bytes, numpy's seed check, polars'
    duplicate projection)."""
    res = CliRunner().invoke(app, ["fit", str(greedy_run), *args, "--out", str(tmp_path / "f.json")])
    assert res.exit_code == 2 and words in res.output and "Traceback" not in res.output
    assert not (tmp_path / "f.json").exists()


def test_fit_on_cuda_without_a_gpu_is_one_line(small_run, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    res = CliRunner().invoke(app, ["fit", str(small_run), "--model", "logistic", "--device", "cuda",
                                   "--out", str(tmp_path / "f.json")])
    assert res.exit_code == 2 and "no GPU" in res.output and not (tmp_path / "f.json").exists()


@pytest.mark.parametrize("option", ["max_tree_depth=99999999999", "max_draft_len=10000000000", "history=0"])
def test_cache_options_arctic_cannot_take_are_refused(greedy_run, option):
    res = CliRunner().invoke(app, ["cache", str(greedy_run), "--set", option])
    assert res.exit_code == 2 and option.split("=")[0] in res.output and "Traceback" not in res.output


def test_cache_with_live_av_is_refused_before_collecting(models_dir):
    from svt.config import load_collect_config
    from svt.errors import ConfigError

    base = {"target": str(models_dir / "target"), "draft": str(models_dir / "draft-large"), "workloads": ["code"],
            "temperature": 0, "cache": True, "av": {"fit": "f.json", "costs": "c.yaml"}}
    with pytest.raises(ConfigError, match="unset when `cache` is set"):
        load_collect_config(None, base=base)


@pytest.mark.parametrize("damage", [
    lambda t: t.update(runs="x"), lambda t: t.update(runs=[5]), lambda t: t.clear() or t.update(runs=[]),
    lambda t: t["runs"][0].update(data="garbage"), lambda t: t["runs"][0].update(data=[1, 2]),
    lambda t: t["runs"][0].update(data={"sha256": None, "rows": "13380"}), lambda t: t["runs"][0].update(pair="x"),
    lambda t: t.update(train_request_ids="x"), lambda t: t.update(train_request_ids=[[0]]),
    lambda t: t.update(train_request_ids=[[0, 0.5]]),
])
def test_a_fit_with_a_damaged_training_block_is_refused(small_run, tmp_path, damage):
    """Found by a probe: these were tracebacks, or scored the fit's own training rows as held out."""
    from svt.fit import fit_runs

    path = fit_runs([small_run], "logistic").save(tmp_path / "lr.json")
    fit = json.loads(path.read_text())
    damage(fit["training"])
    path.write_text(json.dumps(fit))
    res = CliRunner().invoke(app, ["evaluate", str(small_run), "--feature", "q_max", "--fit", str(path),
                                   "--out", str(tmp_path / "rep")])
    assert res.exit_code == 2 and "damaged logistic fit" in res.output and "Traceback" not in res.output


def test_a_fit_is_never_written_inside_a_run(small_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    res = CliRunner().invoke(app, ["fit", str(run), "--model", "logistic", "--out", str(run / "drafts" / "f.json")])
    assert res.exit_code == 2 and "inside the run directory" in res.output
    assert not (run / "drafts" / "f.json").exists()


def test_a_singular_online_fit_is_one_line(small_run, tmp_path):
    """Found by a probe: `--ridge 0` gave numpy's LinAlgError as a traceback. A run whose feature is
    one constant makes the slope and the intercepts collinear: singular without a ridge."""
    import shutil

    from svt.traces.io import record_shards, write_meta

    run = tmp_path / "flat"
    shutil.copytree(small_run, run)
    parts = sorted((run / "drafts").glob("part-*.parquet"))
    for p in parts:
        pl.read_parquet(p).with_columns(pl.lit(1.0).cast(pl.Float32).alias("q_max")).write_parquet(p)
    meta = json.loads((run / "run.json").read_text())
    record_shards(meta, "drafts", parts)
    write_meta(run, meta)
    res = CliRunner().invoke(app, ["fit", str(run), "--model", "irls-online", "--ridge", "0",
                                   "--out", str(tmp_path / "f.json")])
    assert res.exit_code == 5 and "singular" in res.output and "--ridge > 0" in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "f.json").exists()


@pytest.mark.parametrize("args", [["--replay-bootstrap", "5"], ["--replay-bootstrap", "1", "--costs", "x.yaml"],
                                  ["--replay-bootstrap", "100000", "--costs", "x.yaml"]])
def test_replay_bootstrap_needs_the_replay_and_a_sane_count(small_run, tmp_path, args):
    res = CliRunner().invoke(app, ["evaluate", str(small_run), "--feature", "q_max", "--out", str(tmp_path / "r"), *args])
    assert res.exit_code == 2 and "--replay-bootstrap" in res.output and not (tmp_path / "r").exists()
