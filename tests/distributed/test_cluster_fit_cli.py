"""``svt fit RUN --model logistic --cluster local:2`` writes the fit file the single machine writes:
the same coefficients (to 1e-10), the same training record (request ids, signatures, token
signatures, counts), and `svt evaluate` scores it on the same held-out requests."""

import json

import pytest
from typer.testing import CliRunner

from svt.cli import app


def _fit(run, out, *extra):
    r = CliRunner().invoke(app, ["fit", str(run), "--model", "logistic", "--out", str(out), *extra])
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())


def test_the_cluster_writes_the_single_machines_fit(small_run, tmp_path):
    one = _fit(small_run, tmp_path / "one.json", "--features", "logit_qmax", "--features", "entropy")
    two = _fit(small_run, tmp_path / "two.json", "--features", "logit_qmax", "--features", "entropy",
               "--cluster", "local:2")
    assert two["slope"] == pytest.approx(one["slope"], abs=1e-10)
    assert two["intercepts"] == pytest.approx(one["intercepts"], abs=1e-10)
    skip = {"created", "svt_version"}
    ta, tb = one["training"], two["training"]
    assert {k: v for k, v in ta.items() if k not in skip} == {k: v for k, v in tb.items() if k not in skip}
    assert tb["train_request_ids"] and tb["test_fraction"] == 0.3


@pytest.mark.parametrize("args, words", [
    (["--model", "isotonic"], "logistic or yield-linear"),
    (["--model", "logistic,isotonic"], "several at once and --by run on one"),
    (["--model", "logistic", "--by", "workload"], "several at once and --by run on one"),
])
def test_what_the_cluster_does_not_fit_is_refused(small_run, tmp_path, args, words):
    r = CliRunner().invoke(app, ["fit", str(small_run), "--out", str(tmp_path / "f.json"), "--cluster", "local:1", *args])
    assert r.exit_code != 0 and words in r.output and "Traceback" not in r.output


class ShardsReversed:
    """An engine in this process that sees the run's shards listed last to first (a run whose shard
    files are listed in another order): the split must not depend on the order."""

    workers = 1

    def map(self, fn, items, *args):
        return [fn(item, *args) for item in items[::-1]]

    def peak_memory(self):
        return [0.0]


def test_the_split_does_not_depend_on_the_order_of_the_shards(small_run, tmp_path):
    from svt.distributed.fit_run import cluster_training
    from svt.fit import fit_prepared, fit_runs, prepare_fit
    from svt.traces.synthetic import write_run

    run = write_run(small_run, tmp_path / "synth", 4000, shard_labelled=800, steps_per_request=10, seed=3)
    assert len(list((run / "drafts").glob("*.parquet"))) >= 3
    one = fit_runs([run], "logistic")
    cls, est, tf, seed = prepare_fit("logistic")
    two = fit_prepared([run], cls, est, tf, seed, None, training=cluster_training(ShardsReversed()))
    assert two.training_["train_request_ids"] == one.training_["train_request_ids"]
    assert float(two.slope_[0]) == pytest.approx(float(one.slope_[0]), abs=1e-10)


def test_the_cluster_writes_the_single_machines_yield_linear_fit(greedy_run, tmp_path):
    """Ridge from summed centred statistics against scikit-learn's on the training rows: the same
    standardisation (to 1e-12), predictions (to 1e-9; two nearly collinear features may trade
    weight at 1e-9 of their coefficients), the same training record."""
    from svt.fit import Fitter
    from svt.fit.yield_data import load_cache_drafts_for_fit
    from svt.fit.yield_models import yield_matrix

    paths = [_fit_model(greedy_run, tmp_path / "one.json", "yield-linear"),
             _fit_model(greedy_run, tmp_path / "two.json", "yield-linear", "--cluster", "local:2")]
    one, two = (json.loads(p.read_text()) for p in paths)
    for key in ("mean", "std"):
        assert two[key] == pytest.approx(one[key], rel=1e-12, abs=1e-15), key
    assert two["coef"] == pytest.approx(one["coef"], rel=1e-6) and two["intercept"] == pytest.approx(one["intercept"], rel=1e-9)
    rows, _ = load_cache_drafts_for_fit([greedy_run])
    a, b = (Fitter.load(p)._raw(yield_matrix(rows, one["features"])) for p in paths)  # before the clip
    assert b == pytest.approx(a, abs=1e-9)
    ta, tb = one["training"], two["training"]
    assert tb["mean_yield"] == pytest.approx(ta["mean_yield"], rel=1e-12)
    skip = {"created", "svt_version", "mean_yield"}
    assert {k: v for k, v in ta.items() if k not in skip} == {k: v for k, v in tb.items() if k not in skip}
    assert tb["train_request_ids"] and tb["rows"] > 0


def _fit_model(run, out, model, *extra):
    r = CliRunner().invoke(app, ["fit", str(run), "--model", model, "--out", str(out), *extra])
    assert r.exit_code == 0, r.output
    return out


def test_ridge_from_sums_is_scikit_learns():
    """Features with large means and small spreads: the two passes keep scikit-learn's digits."""
    import numpy as np
    from sklearn.linear_model import Ridge

    from svt.distributed.fit_yield import ridge_from_sums

    rng = np.random.default_rng(0)
    X = rng.normal(size=(500, 3)) * [1.0, 0.01, 100.0] + [1e6, -3.0, 5e4]
    y = X @ [1e-6, 20.0, 0.01] + rng.normal(size=500)
    mean, std = X.mean(0), X.std(0) + 1e-9
    ref = Ridge(alpha=1e-3).fit((X - mean) / std, y)
    mx, my = X.mean(0), y.mean()
    got = ridge_from_sums(500, mx, my, (X - mx).T @ (X - mx), (X - mx).T @ (y - my))
    assert got[1] == pytest.approx(std, rel=1e-12)
    assert got[2] == pytest.approx(ref.coef_, rel=1e-9) and got[3] == pytest.approx(ref.intercept_, rel=1e-9)


@pytest.mark.parametrize("damage, words", [("drop", "cache_drafts lacks requests"), ("yield", "does not match its draft"),
                                           ("split", "span two shards")])
def test_cache_drafts_that_disagree_with_the_outputs_are_refused(greedy_run, tmp_path, damage, words):
    """Each shard checked row by row on its worker, the coverage of the requests on the driver."""
    import shutil

    import polars as pl

    from tests.conftest import reseal

    run = tmp_path / "run"
    shutil.copytree(greedy_run, run)
    shard = sorted((run / "cache_drafts").glob("*.parquet"))[-1]
    f = pl.read_parquet(shard)
    if damage == "drop":
        f = f.filter(pl.col("request") != f["request"].max())
    elif damage == "split":  # half of one request's rows moved to another shard: a valid table, split
        other = sorted((run / "cache_drafts").glob("*.parquet"))[0]
        r = f["request"].max()
        moved = f.filter((pl.col("request") == r) & (pl.col("decode_pos") >= 5))
        pl.concat([pl.read_parquet(other), moved]).write_parquet(other)
        f = f.filter(~((pl.col("request") == r) & (pl.col("decode_pos") >= 5)))
    else:
        i = f.with_row_index("_i").filter(pl.col("draft_len") > pl.col("oracle_accepted")).row(0, named=True)["_i"]
        f = f.with_columns(pl.when(pl.int_range(pl.len()) == i).then(pl.col("oracle_accepted") + 1)
                           .otherwise(pl.col("oracle_accepted")).cast(f.schema["oracle_accepted"]).alias("oracle_accepted"))
    f.write_parquet(shard)
    reseal(run)
    r = CliRunner().invoke(app, ["fit", str(run), "--model", "yield-linear", "--out", str(tmp_path / "f.json"),
                                 "--cluster", "local:1"])
    assert r.exit_code != 0 and words in r.output and "Traceback" not in r.output
    assert not (tmp_path / "f.json").exists()
