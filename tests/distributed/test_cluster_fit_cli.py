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
    (["--model", "isotonic"], "--cluster fits one logistic model"),
    (["--model", "logistic,isotonic"], "other models and --by run on one"),
    (["--model", "logistic", "--by", "workload"], "other models and --by run on one"),
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
